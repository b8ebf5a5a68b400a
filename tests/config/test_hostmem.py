"""verify_host_memory: pinned bytes per node against the tighter of RAM and the cgroup limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram._generated.structs import RUNTIME_CHECKS
from engram.config import ConfigError, HostLimits, ParallelConfig, load_config
from engram.memory.host import pinned_bytes_per_node, read_host_limits

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
    config = load_config({"dp_shared_memory": False}, env={})
    parallel = ParallelConfig(tensor_parallel_size=4, data_parallel_size=2)
    config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB))
    with pytest.raises(ConfigError) as exc:
        config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB, cgroup_bytes=300 * GIB))
    (problem,) = exc.value.errors
    assert (problem.path, problem.rule) == ("/engram/cpu_offload", "host-memory")
    assert RUNTIME_CHECKS[problem.rule] == problem.path  # the rule the schema declares (x-engram-checks)
    assert problem.message == (
        "Engram tables need 405,516,064,800 bytes (377.7 GiB) of pinned host memory per node, but the container "
        "memory limit leaves only 322,122,547,200 bytes (300.0 GiB) (physical RAM 2,199,023,255,552, container "
        "memory limit 322,122,547,200). Keep the tables on the GPU with --engram-config '{\"cpu_offload\": false}', "
        "share one copy per node with dp_shared_memory, or shard them across replicas with embedding_across_dp."
    )
    with pytest.raises(ConfigError) as exc:
        config.verify_host_memory(TABLE, parallel, HostLimits(300 * GIB))
    assert "but the physical RAM leaves only 322,122,547,200 bytes" in exc.value.errors[0].message
    assert "no container memory limit" in exc.value.errors[0].message


def test_little_headroom_is_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    config = load_config({"dp_shared_memory": False}, env={})
    parallel = ParallelConfig(tensor_parallel_size=4, data_parallel_size=2)  # 377.7 GiB per node
    with caplog.at_level("WARNING", logger="engram"):
        config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB, cgroup_bytes=400 * GIB))
    assert [r.getMessage() for r in caplog.records] == [
        "Engram tables pin 405,516,064,800 bytes (377.7 GiB) of host memory per node, leaving 23,980,664,800 bytes "
        "(22.3 GiB, under 10%) of the container memory limit (physical RAM 2,199,023,255,552, container memory limit "
        "429,496,729,600) for everything else"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="engram"):
        config.verify_host_memory(TABLE, parallel, HostLimits(2 * 1024 * GIB))
    assert caplog.records == []  # plenty of room: nothing to say


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
