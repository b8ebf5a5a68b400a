"""Storage placements, exact-size mappings, release, and huge pages."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
import torch

from engram.config import load_config
from engram.errors import EngramError
from engram.memory.mapping import PAGE, map_anonymous
from engram.memory.smaps import smaps_totals
from engram.runtime.placement.hugepages import map_huge, thp_mode
from engram.runtime.placement.storage import allocate, placement_for
from engram.runtime.shard import ShardFormat


@pytest.mark.parametrize(
    ("fields", "platform", "expected"),
    [
        ({"cpu_offload": False}, "cuda", "device"),
        ({}, "cuda", "pinned"),
        ({}, "cpu", "host"),
        ({"use_thp": True}, "cuda", "hugepages"),
        ({"dp_shared_memory": True}, "rocm", "shm"),
        ({"dp_shared_memory": True}, "cpu", "shm"),
    ],
)
def test_placement(fields: dict[str, bool], platform: str, expected: str) -> None:
    assert placement_for(load_config(fields, env={}), platform) == expected


def test_format_bytes() -> None:
    fmt = ShardFormat(rows=1000, dim=256, dtype="fp8")
    assert (fmt.weight_bytes, fmt.scale_offset, fmt.nbytes, fmt.row_bytes) == (256_000, 256_000, 264_000, 264)
    odd = ShardFormat(rows=3, dim=32, dtype="fp8")
    assert (odd.weight_bytes, odd.scale_offset, odd.nbytes) == (96, 128, 131)  # scales start 128-byte aligned
    assert ShardFormat(rows=10, dim=80, dtype="bf16").nbytes == 1600
    with pytest.raises(EngramError, match="fp8 rows need a dim divisible by 32"):
        ShardFormat(rows=1, dim=48, dtype="fp8")
    with pytest.raises(EngramError, match="table dtype must be one of fp8, fp8-table, nvfp4, bf16, fp16, fp32"):
        ShardFormat(rows=1, dim=32, dtype="int4")
    # Qwen4Exp's: fp8 with one float32 per table; NVFP4, two values a byte, e4m3 per 16, a float32 per table
    table = ShardFormat(rows=3, dim=80, dtype="fp8-table")
    assert (table.weight_shape, table.table_scale_offset, table.nbytes, table.row_bytes) == ((3, 80), 256, 260, 80)
    nvfp4 = ShardFormat(rows=3, dim=80, dtype="nvfp4")
    assert (nvfp4.weight_shape, nvfp4.scale_shape, nvfp4.row_bytes) == ((3, 40), (3, 5), 45)
    assert (nvfp4.scale_offset, nvfp4.table_scale_offset, nvfp4.nbytes) == (128, 256, 260)
    with pytest.raises(EngramError, match="nvfp4 rows need a dim divisible by 16, got 40"):
        ShardFormat(rows=1, dim=40, dtype="nvfp4")


def mapped_lengths(addr: int, length: int) -> int:
    return smaps_totals(addr, length, ("Size",))["Size"]


@pytest.mark.parametrize("placement", ["host", "pinned"])
def test_host_shard_is_exact_size_and_released(placement: str) -> None:
    fmt = ShardFormat(rows=10_001, dim=128, dtype="fp8")
    shard = allocate("t", fmt, placement)  # type: ignore[arg-type]
    assert shard.mapping is not None and shard.mapping.length == -(-fmt.nbytes // PAGE) * PAGE
    assert mapped_lengths(shard.mapping.addr, shard.mapping.length) == shard.mapping.length
    assert shard.weight.dtype == torch.float8_e4m3fn and shard.weight.shape == (10_001, 128)
    assert shard.scale is not None and shard.scale.dtype == torch.float8_e8m0fnu and shard.scale.shape == (10_001, 4)
    assert shard.scale.data_ptr() - shard.weight.data_ptr() == fmt.scale_offset
    addr, length = shard.mapping.addr, shard.mapping.length
    assert shard.release() is True
    assert mapped_lengths(addr, length) == 0


def test_release_waits_for_outside_views_and_gc_frees() -> None:
    shard = allocate("t", ShardFormat(rows=4096, dim=32, dtype="fp32"), "host")
    addr, length = shard.mapping.addr, shard.mapping.length  # type: ignore[union-attr]
    view = shard.weight[:2]
    view.fill_(1.5)
    assert shard.release() is False  # a view is still out there: memory stays valid
    assert view.sum().item() == 6 * 32 / 2
    del view
    gc.collect()
    assert mapped_lengths(addr, length) == 0
    other = allocate("u", ShardFormat(rows=4096, dim=32, dtype="fp32"), "host")
    addr, length = other.mapping.addr, other.mapping.length  # type: ignore[union-attr]
    del other
    gc.collect()
    assert mapped_lengths(addr, length) == 0


def test_device_placement_on_cpu_platform() -> None:
    shard = allocate("t", ShardFormat(rows=8, dim=32, dtype="bf16"), "device", device="cpu")
    assert shard.mapping is None and shard.weight.device.type == "cpu" and shard.scale is None
    assert shard.release() is True


def test_huge_pages_coverage_reported() -> None:
    if thp_mode() in ("never", "unavailable"):
        pytest.skip(f"transparent huge pages are {thp_mode()} on this machine")
    report = map_huge(16 << 20)
    assert report.mapping.addr % (2 << 20) == 0 and report.mapping.length == 16 << 20
    assert 0.0 <= report.coverage <= 1.0
    assert report.huge_bytes == round(report.coverage * report.mapping.length)
    assert report.note.startswith(f"THP {report.thp_mode}: {report.coverage:.0%} of 16,777,216 bytes on huge pages")
    shard = allocate("t", ShardFormat(rows=1 << 16, dim=128, dtype="fp8"), "hugepages")
    assert shard.note.startswith("THP ") and shard.weight.data_ptr() % (2 << 20) == 0


def test_huge_pages_fall_back_when_thp_is_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "enabled").write_text("always madvise [never]\n")
    (tmp_path / "hpage_pmd_size").write_text(str(2 << 20))
    with caplog.at_level(logging.WARNING, logger="engram.hugepages"):
        report = map_huge(4 << 20, thp=tmp_path)
    assert (report.thp_mode, report.coverage, report.huge_bytes) == ("never", 0.0, 0)
    assert report.note == "transparent huge pages are never on this kernel; the table uses ordinary pages"
    assert any("the table uses ordinary pages" in r.getMessage() for r in caplog.records)
    view = report.mapping.view(0, (4 << 20,), torch.uint8)
    view[::4096] = 7  # the fallback memory works
    assert int(view.sum()) == 7 * 1024


def test_anonymous_alignment() -> None:
    mapping = map_anonymous(3 << 20, align=2 << 20)
    assert mapping.addr % (2 << 20) == 0 and mapping.length == 4 << 20
    assert mapped_lengths(mapping.addr, mapping.length) == 4 << 20
