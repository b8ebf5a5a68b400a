"""A tier of hot rows read through cached_gather: bit for bit the uncached lookup through the CPU twins
(hits, misses, DEAD_ID, rows of other shards, ids outside the table), started from an `engram profile`
file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from engram.apps.local_ranks import run_local, values
from engram.errors import EngramError
from engram.ops import GatherCall, gather
from engram.runtime.tiers.device import DeviceTier
from engram.runtime.tiers.hot_rows import cached_gather
from engram.runtime.tiers.profile import read_profile
from tests.runtime import sharding_workers
from tests.runtime.shards import random_shard


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 60),
    row_start=st.integers(0, 30),
    dtype=st.sampled_from(["fp8", "bf16"]),
    hot=st.lists(st.integers(0, 99), max_size=40, unique=True),
    ids=st.lists(st.integers(-1, 99), min_size=1, max_size=120),
    budget_rows=st.integers(0, 50),
)
def test_cached_equals_uncached(
    rows: int, row_start: int, dtype: str, hot: list[int], ids: list[int], budget_rows: int
) -> None:
    shard = random_shard(rows, dtype, rows + row_start, row_start=row_start)
    tier = DeviceTier(shard, budget_rows + 1, "cpu", policy="static")
    held = tier.warm(torch.tensor(hot, dtype=torch.int64))
    owned = [h for h in hot if row_start <= h < row_start + rows][: budget_rows + 1]
    cache = tier.rows
    assert held == len(owned) and cache.ids[:held].tolist() == sorted(owned)  # the most frequent owned rows
    out_dtype = torch.bfloat16 if dtype == "fp8" else torch.float32  # a dequantisation, and a conversion
    batch = torch.tensor(ids).view(-1, 1)
    want = gather(shard.weight, shard.scale, batch, row_start, 100, out_dtype)
    got = cached_gather(cache, GatherCall(shard.weight, shard.scale, batch, row_start, 100, out_dtype))
    assert got.dtype == want.dtype and torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_an_id_outside_the_table_still_raises() -> None:
    shard = random_shard(10, "fp8", 1)
    tier = DeviceTier(shard, 4, "cpu", policy="static")
    tier.warm(torch.tensor([3, 4]))
    cache = tier.rows
    with pytest.raises(EngramError, match=r"row id 10 is outside the table's 10 rows"):
        cached_gather(cache, GatherCall(shard.weight, shard.scale, torch.tensor([3, 10]), 0, 10, torch.bfloat16))


def test_profile_errors(tmp_path: Path) -> None:
    from engram.config import load_config
    from engram.runtime.table import Table
    from engram.runtime.tiers.assign import keep_hot

    shard = random_shard(10, "fp8", 1)
    config = load_config({"cpu_offload": True, "device_cache_bytes": 1 << 20}, env={})
    with pytest.raises(EngramError, match="the profile has no hot rows for t"):
        keep_hot(config, [Table(shard, 10)], torch.device("cpu"), {})
    with pytest.raises(EngramError, match="lists a row twice"):
        DeviceTier(shard, 4, "cpu").warm(torch.tensor([3, 3]))
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(EngramError) as raised:
        read_profile(missing)
    assert str(raised.value) == f"the profile {missing} cannot be read: No such file or directory (a dangling link?)"


def test_a_corrupt_profile_or_a_fifo_is_a_one_line_error(tmp_path: Path) -> None:
    """A profile whose header is garbage raises EngramError (not safetensors' own error), and a FIFO is
    refused before it is opened (opening it would wait for a writer forever)."""
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes((40).to_bytes(8, "little") + b"{" + b"\xff" * 39)
    with pytest.raises(EngramError) as raised:
        read_profile(corrupt)
    assert str(raised.value).startswith(f"cannot read the profile {corrupt}: ")
    assert str(raised.value).endswith("; write one with `engram profile --out`")
    fifo = tmp_path / "profile.fifo"
    os.mkfifo(fifo)
    with pytest.raises(EngramError) as raised:
        read_profile(fifo)
    assert str(raised.value) == f"the profile {fifo} is a FIFO; it must be a regular file"


@pytest.mark.slow
def test_tables_with_a_device_cache_from_engram_profile(
    tmp_path: Path, tiny_profile: tuple[dict[str, Any], Path, Path]
) -> None:
    """engram profile --out, then EngramTables with device_cache_bytes: equal to the uncached lookup."""
    from engram.apps.presets import get_preset
    from engram.runtime.checkpoints.writer import write_checkpoint

    profile = tiny_profile[1]
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(get_preset("tiny"), checkpoint, seed=3)
    reports = values(run_local(2, sharding_workers.cached_lookup, str(checkpoint), str(profile), timeout=300))
    for report in reports:
        assert report["match"] is True and report["hits"] > 0 and report["cached_rows"] > 0
        # EngramTables.stats(): each of the rank's tables once, looked up once per layer it serves
        assert [(name, lookups) for name, lookups, _ in report["stats"]] == list(
            zip(report["names"], report["layers_of_table"], strict=True)
        )
        assert sum(rows for _, _, rows in report["stats"]) == report["cached_rows"]
        assert report["counted_hits"] == report["hits"]  # the device cache's own counters, exactly
        # online from no profile: bit-equal across refreshes; the device counters saw every id the host did
        assert report["online_match"] is True
        for policy, refreshes, hits, lookups, ids in report["online"]:
            assert policy == "online" and refreshes >= 1 and 0 < hits < lookups == ids


def test_a_profile_rewritten_after_it_was_read_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "hot.safetensors"
    rows = torch.arange(1000, dtype=torch.int64).flip(0)
    save_file({"t.hot_rows": rows, "t.hot_counts": torch.ones(1000, dtype=torch.int64)}, str(path))
    expected = load_file(str(path))["t.hot_rows"].clone()  # safetensors' own reader, copied
    hot = read_profile(path)
    with path.open("r+b") as f:  # rewritten in place, then cut short: a mapping of it would now SIGBUS
        f.write(b"\xff" * 4096)
        f.truncate(16)
    assert torch.equal(hot["t"], expected)


SPARSE_PROFILE = """
import resource, sys
from engram.errors import EngramError
from engram.runtime.tiers.profile import read_profile
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
try:
    read_profile(sys.argv[1])
except EngramError as exc:
    print(exc)
"""


def test_a_sparse_profile_claiming_more_than_memory_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "huge.safetensors"
    count = 2 << 30  # 16 GiB of int64 hot rows, none of them on disk
    header = json.dumps({"t.hot_rows": {"dtype": "I64", "shape": [count], "data_offsets": [0, count * 8]}}).encode()
    with path.open("wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + count * 8)
    done = subprocess.run(
        [sys.executable, "-c", SPARSE_PROFILE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert done.stdout.startswith(f"cannot read the profile {path}: its hot rows do not fit in this process's memory")
