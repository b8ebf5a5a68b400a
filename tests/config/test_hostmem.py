"""verify_host_memory: pinned bytes per node against the tighter of RAM and the cgroup limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.config import ConfigError, HostLimits, ParallelConfig, load_config
from engram.hostmem import pinned_bytes_per_node, read_host_limits

TABLE = 202_758_032_400  # V4.1-Flash, fp8 rows with scales
GIB = 1 << 30


@pytest.mark.parametrize(
    ("fields", "dp", "local", "expected"),
    [
        ({}, 8, 8, TABLE * 8),
        ({}, 8, 2, TABLE * 2),
        ({"embedding_across_dp": True}, 8, 8, TABLE),
        ({"embedding_across_dp": True}, 8, 2, TABLE * 2 // 8),
    ],
)
def test_pinned_bytes(fields: dict[str, bool], dp: int, local: int, expected: int) -> None:
    parallel = ParallelConfig(tensor_parallel_size=4, data_parallel_size=dp, data_parallel_size_local=local)
    assert pinned_bytes_per_node(load_config(fields, env={}), TABLE, parallel) == expected


def test_fits_and_does_not_fit() -> None:
    config = load_config(env={})
    parallel = ParallelConfig(tensor_parallel_size=4, data_parallel_size=2)
    config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB))
    with pytest.raises(ConfigError) as exc:
        config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB, cgroup_bytes=300 * GIB))
    (problem,) = exc.value.errors
    assert (problem.path, problem.rule) == ("/engram/cpu_offload", "host-memory")
    assert problem.message == (
        "Engram tables need 405,516,064,800 bytes (377.7 GiB) of pinned host memory per node, but only "
        "322,122,547,200 bytes (300.0 GiB) are available (physical RAM 2,199,023,255,552, cgroup limit "
        "322,122,547,200). Keep the tables on the GPU with --engram-config '{\"cpu_offload\": false}', share one "
        "copy per node with dp_shared_memory, or shard them across replicas with embedding_across_dp."
    )


@pytest.mark.parametrize("fields", [{"cpu_offload": False}, {"dp_shared_memory": True}])
def test_skipped_for_gpu_and_shared_tables(fields: dict[str, bool]) -> None:
    config = load_config(fields, env={})
    config.verify_host_memory(TABLE, ParallelConfig(data_parallel_size=8), HostLimits(GIB))


def test_reads_meminfo_and_cgroups(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal:       24576000 kB\nMemFree: 1 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("8589934592\n")
    assert read_host_limits(tmp_path / "proc", v2) == HostLimits(24576000 * 1024, 8589934592)
    (v2 / "memory.max").write_text("max\n")
    assert read_host_limits(tmp_path / "proc", v2) == HostLimits(24576000 * 1024, None)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert read_host_limits(tmp_path / "proc", v1).cgroup_bytes is None
    (v1 / "memory/memory.limit_in_bytes").write_text("4294967296\n")
    assert read_host_limits(tmp_path / "proc", v1) == HostLimits(24576000 * 1024, 4294967296)
    assert read_host_limits(tmp_path / "proc", tmp_path / "none").available == 24576000 * 1024


def test_this_machine() -> None:
    limits = read_host_limits()
    assert limits.physical_bytes > 0 and 0 < limits.available <= limits.physical_bytes
