"""Will the tables fit in one node's host memory? The limit is the smaller of physical RAM and the
cgroup (v2, else v1) memory limit; both can be passed in, so tests need not depend on this machine."""

from __future__ import annotations

import contextlib
import logging
import resource
from pathlib import Path
from typing import NamedTuple, Protocol

from engram.errors import ConfigError, Problem


class TableSharing(Protocol):
    """The EngramConfig fields the check reads (typed structurally: this floor imports no config)."""

    @property
    def cpu_offload(self) -> bool: ...
    @property
    def embedding_across_dp(self) -> bool: ...
    @property
    def dp_shared_memory(self) -> bool | None: ...  # None, unresolved, counts as private
    @property
    def file_backed(self) -> bool: ...


class Replicas(Protocol):
    """The ParallelConfig fields the check reads."""

    @property
    def data_parallel_size(self) -> int: ...
    @property
    def data_parallel_size_local(self) -> int | None: ...


GIB = 1 << 30
HEADROOM = 0.10  # below this share of the binding limit left free, the tables fit but a warning is logged
log = logging.getLogger("engram")
# cgroup v1 reports "no limit" as a huge page-aligned number rather than "max".
_V1_UNLIMITED = 1 << 60


class HostLimits(NamedTuple):
    physical_bytes: int
    cgroup_bytes: int | None = None  # None: no cgroup limit

    @property
    def available(self) -> int:
        return min(self.physical_bytes, self.cgroup_bytes or self.physical_bytes)

    @property
    def bound(self) -> str:
        """Which limit binds, in vLLM's words."""
        return (
            "container memory limit"
            if self.cgroup_bytes is not None and self.cgroup_bytes < self.physical_bytes
            else "physical RAM"
        )


def read_host_limits(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> HostLimits:
    physical = 0
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            physical = int(line.split()[1]) * 1024
    limits = [limit for limit, _ in _memory_groups(proc, cgroup)]
    return HostLimits(physical, min(limits) if limits else None)


def free_bytes_now(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes this process could still allocate now: the node's MemAvailable, less what each memory cgroup
    it is in has left (its limit less its usage: memory.max - memory.current, or v1's), less what
    RLIMIT_AS leaves of the address space."""
    free = 0
    for line in (proc / "meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            free = int(line.split()[1]) * 1024
    for limit, usage in _memory_groups(proc, cgroup):
        with contextlib.suppress(OSError, ValueError):
            free = min(free, limit - int(usage.read_text()[:64]))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        with contextlib.suppress(OSError, ValueError, IndexError):
            size = next(
                line for line in (proc / "self" / "status").read_text().splitlines() if line.startswith("VmSize:")
            )
            free = min(free, soft - int(size.split()[1]) * 1024)
    return max(0, free)


# A memory cgroup's limit and usage files: v2's unified hierarchy, and v1's memory controller below its mount.
_V2 = ("", "memory.max", "memory.current")
_V1 = ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes")


def _memory_groups(proc: Path, cgroup: Path) -> list[tuple[int, Path]]:
    """(limit, usage file) of each memory cgroup this process is in that has a limit: its own and its
    ancestors' (/proc/self/cgroup names them; a parent's limit binds its children too), or, without that
    file, the hierarchy's root (a container's own group, under a cgroup namespace)."""
    try:
        text = (proc / "self" / "cgroup").read_text()[:65536]
    except OSError:
        text = ""
    groups: list[tuple[tuple[str, str, str], list[str]]] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        kind = _V2 if hierarchy == "0" and not controllers else _V1 if "memory" in controllers.split(",") else None
        if kind is not None:
            groups.append((kind, [part for part in path.split("/") if part and part not in (".", "..")]))
    found = []
    for (mount, limit_name, usage_name), parts in groups or [(_V2, []), (_V1, [])]:
        for depth in range(len(parts), -1, -1):
            directory = cgroup.joinpath(mount, *parts[:depth])
            limit = _limit_in(directory / limit_name)
            if limit is not None:
                found.append((limit, directory / usage_name))
    return found


def _limit_in(path: Path) -> int | None:
    """The bytes a cgroup's limit file holds, or None for no limit (v2's "max", v1's huge number, no file)."""
    try:
        text = path.read_text()[:64].strip()
    except OSError:
        return None
    if text == "max" or not text.isdigit() or int(text) >= _V1_UNLIMITED:
        return None
    return int(text)


def pinned_bytes_per_node(config: TableSharing, table_bytes: int, parallel: Replicas) -> int:
    """Host bytes the tables pin on one node with private copies: every local replica holds the whole
    table across its TP ranks, or its 1/DP share of it with embedding_across_dp."""
    local = parallel.data_parallel_size_local or parallel.data_parallel_size
    if config.embedding_across_dp:
        return table_bytes * local // parallel.data_parallel_size
    return table_bytes * local


def verify_host_memory(
    config: TableSharing, table_bytes: int, parallel: Replicas, limits: HostLimits | None = None
) -> None:
    """The seed's check, for its layout (a private TP-sharded copy per replica, or a 1/DP share with
    embedding_across_dp); a deployment plan knows its exact bytes and calls check_pinned_bytes itself.
    Skipped for GPU tables (cpu_offload false), for dp_shared_memory, whose /dev/shm capacity check runs
    at load time instead, and for file_backed tables, which live in the page cache and may exceed RAM."""
    if not config.cpu_offload or config.dp_shared_memory or config.file_backed:
        return
    check_pinned_bytes(pinned_bytes_per_node(config, table_bytes, parallel), limits)


def check_pinned_bytes(needed: int, limits: HostLimits | None = None) -> None:
    """`needed` bytes of private host tables on the busiest node against the binding limit: an error
    naming the fixes past it, a warning when under HEADROOM of it is left."""
    limits = read_host_limits() if limits is None else limits
    cgroup = (
        "no container memory limit"
        if limits.cgroup_bytes is None
        else f"container memory limit {limits.cgroup_bytes:,}"
    )
    figures = f"physical RAM {limits.physical_bytes:,}, {cgroup}"
    if needed <= limits.available:
        left = limits.available - needed
        if left < HEADROOM * limits.available:
            log.warning(
                "Engram tables pin %s bytes (%.1f GiB) of host memory per node, leaving %s bytes (%.1f GiB, under %d%%) of the %s (%s) for everything else",
                f"{needed:,}", needed / GIB, f"{left:,}", left / GIB, round(HEADROOM * 100), limits.bound, figures,
            )  # fmt: skip
        return
    raise ConfigError(
        [
            Problem(
                "/engram/cpu_offload",
                "host-memory",  # declared in the schema's x-engram-checks (tests/config/test_hostmem.py holds them equal)
                f"Engram tables need {needed:,} bytes ({needed / GIB:.1f} GiB) of pinned host memory per node, "
                f"but the {limits.bound} leaves only {limits.available:,} bytes ({limits.available / GIB:.1f} GiB) "
                f"({figures}). Keep the tables on the GPU with "
                "--engram-config '{\"cpu_offload\": false}', share one copy per node with dp_shared_memory, "
                "or shard them across replicas with embedding_across_dp.",
            )
        ]
    )
