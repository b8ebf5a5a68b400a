"""verify_host_memory: pinned bytes per node against the tighter of RAM and the cgroup limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram._generated.structs import RUNTIME_CHECKS
from engram.config import ConfigError, HostLimits, ParallelConfig, load_config
from engram.memory.host import free_bytes_now, pinned_bytes_per_node, read_host_limits

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


def test_the_groups_this_process_is_in_and_their_ancestors_bind(tmp_path: Path) -> None:
    """/proc/self/cgroup names the process's own groups, deep in each hierarchy: each level's limit counts
    (a parent's binds its children), v2's "max" and v1's huge number count as none."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 33554432 kB\nMemAvailable: 16777216 kB\n")
    (proc / "self" / "cgroup").write_text("5:cpu,cpuacct:/elsewhere\n4:memory:/pod/job\n0::/slice/unit\n")
    files = {
        "memory/pod/memory.limit_in_bytes": 8 * GIB, "memory/pod/memory.usage_in_bytes": 3 * GIB,
        "memory/pod/job/memory.limit_in_bytes": 9223372036854771712, "memory/pod/job/memory.usage_in_bytes": 2 * GIB,
        "slice/memory.max": 6 * GIB, "slice/memory.current": 5 * GIB + 4096,
        "slice/unit/memory.max": "max", "slice/unit/memory.current": GIB,
    }  # fmt: skip
    for name, value in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"{value}\n")
    assert free_bytes_now(proc, root) == GIB - 4096  # the slice's 6 GiB less its 5 GiB and a page
    assert read_host_limits(proc, root) == HostLimits(32 * GIB, 6 * GIB)
    (root / "slice" / "memory.max").write_text("max\n")
    assert free_bytes_now(proc, root) == 5 * GIB  # the pod's 8 GiB less its 3
    assert read_host_limits(proc, root) == HostLimits(32 * GIB, 8 * GIB)
