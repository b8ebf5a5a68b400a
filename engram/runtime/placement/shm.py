"""One host copy of a table shard shared by the data-parallel replicas of a node (dp_shared_memory).

The group is the node-local DP replicas at one TP rank, its rank 0 the leader. By default the table is an
anonymous memfd, which no crash can leak: the kernel frees it when the last process holding it (an fd or
a mapping) is gone. (1) The ranks exchange pid, uid and node identity. (2) The leader checks capacity
against the node's memory, creates the memfd, reserves the space with posix_fallocate (a sparse table
would die with SIGBUS when memory runs out) and listens on an abstract Unix socket under an unpredictable
name (abstract names vanish with their socket). (3) It broadcasts the name, or its error. (4) Each peer
connects and receives the fd (SCM_RIGHTS); the leader hands it only to the group's own pids and uid
(SO_PEERCRED). (5) Every rank maps it; the ranks all-gather their errors, the fence after which the
socket closes. Every wait is bounded by the group's timeout.

With ENGRAM_SHM_DIR set (a hugetlbfs mount, a tmpfs of its own) the table is a named file there instead
(spec/runtime.md): created O_CREAT|O_EXCL, mode 0600, reserved with posix_fallocate, broadcast, mapped
by every rank, and unlinked after the fence. Its name records its owner (boot id, pid, process start
time), so a file a crash left between creation and the fence is reclaimed by the next start in that
directory, or by `engram doctor --clean`. Loading writes from the leader only, with a barrier after each
weight-loader call (loader.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from engram.errors import EngramError
from engram.memory.host import HostLimits
from engram.memory.mapping import Mapping, map_shared_file
from engram.runtime.dist import Group, all_gather_json, broadcast_json
from engram.runtime.placement.memfd import capacity_error as memfd_capacity_error
from engram.runtime.placement.memfd import share_memfd
from engram.runtime.placement.node import GIB, boot_id, fenced, node_of_this_process, reserve


def shm_dir() -> Path:
    """ENGRAM_SHM_DIR, default /dev/shm (tests point it at a small tmpfs)."""
    return Path(os.environ.get("ENGRAM_SHM_DIR") or "/dev/shm")


def uses_memfd() -> bool:
    """Shared tables are anonymous memfds unless ENGRAM_SHM_DIR names a directory for them."""
    return not os.environ.get("ENGRAM_SHM_DIR")


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid, it
    names a process uniquely, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()[19]


def _boot_tag() -> str:
    return boot_id().replace("-", "")[:12]


def owner_tag() -> str:
    """<boot>-<pid>-<start>: names this process's files so that stale_files can tell when it is gone."""
    return f"{_boot_tag()}-{os.getpid()}-{_start_time(os.getpid())}"


def stale_files(directory: Path) -> list[Path]:
    """Named shared tables in `directory` whose creator is gone (same boot, and no live process with its
    pid and start time): what a crash between creation and the fence left behind."""
    boot = _boot_tag()
    found = []
    for path in directory.glob("engram-*"):
        parts = path.name.rsplit("-", 4)  # engram-<tag>-<boot>-<pid>-<start>-<random>
        if len(parts) != 5 or parts[1] != boot or not parts[2].isdigit():
            continue
        if _start_time(int(parts[2])) != parts[3]:
            found.append(path)
    return sorted(found)


def reclaim_stale(directory: Path) -> list[Path]:
    """Remove stale_files(directory) (files only); returns what was removed (a file already gone is not
    an error)."""
    removed = []
    for path in stale_files(directory):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()
            removed.append(path)
    return removed


def node_identity(directory: Path) -> dict[str, Any]:
    """What co-located replicas share: the boot id, and the device of the shm filesystem.
    ENGRAM_NODE_ID replaces the boot id, so tests can simulate several nodes on one machine."""
    boot = node_of_this_process()
    try:
        device: int | None = os.stat(directory).st_dev
    except OSError:
        device = None  # the leader's create reports the unusable directory
    return {"boot_id": boot, "shm_device": device}


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def capacity_error(directory: Path, needed: int) -> str | None:
    free = free_bytes(directory)
    if free >= needed:
        return None
    missing = needed - free
    return (
        f"{directory} has {free:,} bytes free but the shared table needs {needed:,} "
        f"({missing:,} bytes, {missing / GIB:.2f} GiB, missing). Give the container more shared memory "
        "(docker run --shm-size=<size> or --ipc=host; Kubernetes: an emptyDir with medium: Memory), "
        "point ENGRAM_SHM_DIR at a larger tmpfs, or turn dp_shared_memory off"
    )


def shared_capacity_error(size: int, limits: HostLimits | None = None) -> str | None:
    """Why this node cannot hold `size` bytes of shared tables where they would go (a memfd: the node's
    memory, `limits` when given; a named file: ENGRAM_SHM_DIR's free space), or None."""
    if uses_memfd():
        return memfd_capacity_error(size, limits)
    directory = shm_dir()
    if not directory.is_dir():
        return f"{directory} is not mounted"
    return capacity_error(directory, size)


def _create(directory: Path, size: int, tag: str) -> tuple[str | None, str | None]:
    """The leader's step 1: (path, None) or (None, error). Nothing is written before the space is
    reserved, and a failed reservation removes the file."""
    try:
        reclaim_stale(directory)
        error = capacity_error(directory, size)
    except OSError as exc:
        return (
            None,
            f"cannot use {directory} for shared tables: {exc.strerror}; point ENGRAM_SHM_DIR at a writable tmpfs",
        )
    if error:
        return None, error
    path = directory / f"engram-{tag}-{owner_tag()}-{secrets.token_hex(16)}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return None, f"cannot create {path}: {exc.strerror}; point ENGRAM_SHM_DIR at a writable tmpfs"
    try:
        failed = reserve(fd, size)
    finally:
        os.close(fd)
    if failed:
        os.unlink(path)
        return (
            None,
            f"cannot reserve {size:,} bytes in {directory}: {failed}; free space there or point ENGRAM_SHM_DIR elsewhere",
        )
    return str(path), None


def _attach(
    path: str, size: int, leader: dict[str, Any], directory: Path, group: Group
) -> tuple[Mapping | None, str | None]:
    mine = node_identity(directory)
    if mine["boot_id"] != leader["boot_id"]:
        return (
            None,
            f"rank {group.ranks[group.rank]} runs on another node than its leader (boot id differs); dp_shared_memory needs data_parallel_size_local to match the replicas per node",
        )
    if mine["shm_device"] != leader["shm_device"]:
        return (
            None,
            f"rank {group.ranks[group.rank]} sees another {directory} than its leader (a separate IPC or mount namespace); run the replicas with --ipc=host or one shared /dev/shm",
        )
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return (
            None,
            f"rank {group.ranks[group.rank]} cannot see {path}: the replicas do not share {directory} (separate IPC namespaces?); run them with --ipc=host",
        )
    except OSError as exc:
        return None, f"rank {group.ranks[group.rank]} cannot open {path}: {exc.strerror}"
    try:
        if os.fstat(fd).st_size < size:
            return None, f"{path} is smaller than the table ({os.fstat(fd).st_size:,} < {size:,} bytes)"
        return map_shared_file(fd, size, path), None
    except EngramError as exc:
        return None, str(exc)
    finally:
        os.close(fd)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def create_shared(size: int, group: Group, tag: str, directory: Path | None = None) -> Mapping:
    """Collective over `group`: every rank gets a MAP_SHARED mapping of the same `size` bytes, of an
    anonymous memfd (default) or of a named file in `directory` / ENGRAM_SHM_DIR."""
    if directory is None and uses_memfd():
        return share_memfd(size, group, tag)
    directory = shm_dir() if directory is None else directory
    leader = group.rank == 0
    path = error = None
    if leader:
        path, error = _create(directory, size, tag)
    try:
        announced = broadcast_json(
            group,
            {"path": path, "error": error, **node_identity(directory)} if leader else None,
            f"shared table {tag}: announce",
        )
        if announced["error"]:
            raise EngramError(
                f"{group.label}: leader rank {group.ranks[0]} could not create the shared table {tag}: {announced['error']}"
            )
        mapping, error = _attach(announced["path"], size, announced, directory, group)
        try:
            errors = all_gather_json(group, error, f"shared table {tag}: attach")  # the fence
        except EngramError:
            _unlink(announced["path"])  # a peer died before the fence: whoever is left removes the name
            raise
    finally:
        if path is not None:
            _unlink(path)  # the leader's name goes whatever happened: after the fence, or on any failure
    return fenced(group, errors, mapping)
