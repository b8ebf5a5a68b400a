"""Host tables for a GPU in host-NUMA cuMem (engram.memory.host_numa), through a fake runtime: where the
driver gives it, one mapping of 2 MiB GPU pages the GPU reads at its own address, unmapped once when its
last view goes; where it does not (no NUMA node, a node that would be left under its reserve, a driver
call that fails), a registered mapping as before and one warning naming the page size and the reason,
with the failed call's sticky error cleared. The driver side runs emulated under AddressSanitizer
(tests/emulated/cases.py)."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest

from engram.memory import host_numa
from engram.memory.host_numa import CHUNK_BYTES, map_host_numa, pinned_for_gpu
from engram.memory.registration import is_registered
from engram.runtime.placement.storage import allocate
from engram.runtime.shard import ShardFormat
from tests.memory.fakes import FakeHostNumaRuntime, FakeRuntime


def sysfs(tmp_path: Path, node: int, total_kib: int, free_kib: int) -> Path:
    where = tmp_path / f"devices/system/node/node{node}"
    where.mkdir(parents=True)
    (where / "meminfo").write_text(
        f"Node {node} MemTotal:       {total_kib} kB\nNode {node} MemFree:        {free_kib} kB\n"
        f"Node {node} MemUsed:        {total_kib - free_kib} kB\n"
    )
    return tmp_path


def test_a_table_gets_host_numa_memory_with_2_mib_gpu_pages(tmp_path: Path) -> None:
    runtime = FakeHostNumaRuntime(node=0)
    mapping = map_host_numa(5 << 20, runtime, sysfs(tmp_path, 0, 64 << 20, 32 << 20))
    assert not isinstance(mapping, str)
    assert (mapping.size, mapping.length, mapping.gpu_page) == (5 << 20, 6 << 20, 2 << 20)
    assert runtime.calls == [("host_numa_map", 5 << 20, CHUNK_BYTES, 0)]
    assert is_registered(runtime, mapping.addr, mapping.size)  # the GPU reads it without a registration
    view = mapping.view(0, (5 << 20,), __import__("torch").uint8)
    view[-1] = 7
    addr = mapping.addr
    del view
    assert mapping.release() and runtime.unmapped == [(addr, 6 << 20)]
    assert not is_registered(runtime, addr, 1 << 20)
    gc.collect()
    assert runtime.unmapped == [(addr, 6 << 20)]  # once


@pytest.mark.parametrize(
    ("runtime", "memory", "reason"),
    [
        (FakeHostNumaRuntime(node=-1), None, "the machine reports no NUMA node for the GPU"),
        (
            FakeHostNumaRuntime(node=0),
            (64 << 10, 4 << 10),
            f"NUMA node 0 has {4 << 20:,} bytes free, and {1 << 20:,} would leave under 5% of it",
        ),
        (
            FakeHostNumaRuntime(node=0, fail_step=5, fail_code=2),
            None,
            "cuMemCreate failed: out of memory (CUresult 2)",
        ),
        (FakeRuntime(), None, "this runtime has no cuMem calls"),
    ],
)
def test_where_cumem_cannot_be_had_tables_are_registered_and_it_is_said_once(
    runtime: FakeRuntime, memory: tuple[int, int] | None, reason: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = sysfs(tmp_path, 0, *memory) if memory else tmp_path
    host_numa.small_pages.cache_clear()
    original = host_numa.SYSFS
    host_numa.SYSFS = root
    try:
        with caplog.at_level(logging.WARNING, logger="engram"):
            first = pinned_for_gpu(1 << 20, runtime)
            second = pinned_for_gpu(1 << 20, runtime)
    finally:
        host_numa.SYSFS = original
    for mapping in (first, second):
        assert mapping.gpu_page is None and runtime.registered.get(mapping.addr) == mapping.length
    assert runtime.sticky == 0  # a failed driver call's error is cleared
    assert [r.getMessage() for r in caplog.records] == [
        "engram: host tables are registered host memory, which a GPU maps with small pages (64 KiB, not the "
        f"2 MiB of host-NUMA cuMem), so random row lookups miss its TLB more: {reason}"
    ]
    first.release()
    second.release()


def test_a_pinned_shard_on_a_gpu_says_which_memory_it_got() -> None:
    fmt = ShardFormat(100, 256, "fp8")
    ours = allocate("t", fmt, "pinned", runtime=FakeHostNumaRuntime(node=0))
    assert ours.note == "host-NUMA cuMem (2 MiB GPU pages)" and ours.device_pointer == ours.mapping.addr
    assert ours.mapping.gpu_page == 2 << 20
    host_numa.small_pages.cache_clear()
    theirs = allocate("t", fmt, "pinned", runtime=FakeHostNumaRuntime(node=-1))
    assert theirs.note == "registered host memory" and theirs.mapping.gpu_page is None
    assert theirs.device_pointer == theirs.mapping.addr
