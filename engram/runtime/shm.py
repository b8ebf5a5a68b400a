"""One host copy of a table shard shared by the data-parallel replicas of a node (dp_shared_memory).

The protocol (spec/runtime.md): the group is the node-local DP replicas at one TP rank, its rank 0 the
leader. (1) The leader checks capacity, creates the file O_CREAT|O_EXCL, mode 0600, under an
unpredictable name, and reserves the space with posix_fallocate (ftruncate alone leaves a sparse file that
later dies with SIGBUS). (2) It broadcasts the path, or its error. (3) Every rank maps the file; the ranks
all-gather their errors, which is also the fence after which the leader unlinks the name: nothing is left
in the shm directory, even after a crash, and the memory lives while any mapping does. Loading writes
from the leader only, with a barrier after each weight-loader call (loader.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any

from engram.errors import EngramError
from engram.runtime.dist import Group, all_gather_json, broadcast_json
from engram.runtime.mapping import PAGE, Mapping, map_shared_file, round_up

GIB = 1 << 30


def shm_dir() -> Path:
    """ENGRAM_SHM_DIR, default /dev/shm (tests point it at a small tmpfs)."""
    return Path(os.environ.get("ENGRAM_SHM_DIR") or "/dev/shm")


def node_identity(directory: Path) -> dict[str, Any]:
    """What co-located replicas share: the boot id, and the device of the shm filesystem.
    ENGRAM_NODE_ID replaces the boot id, so tests can simulate several nodes on one machine."""
    boot = os.environ.get("ENGRAM_NODE_ID")
    if boot is None:
        try:
            boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        except OSError:
            boot = "unknown"
    return {"boot_id": boot, "shm_device": os.stat(directory).st_dev}


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


def _create(directory: Path, size: int, tag: str) -> tuple[str | None, str | None]:
    """The leader's step 1: (path, None) or (None, error). Nothing is written before the space is
    reserved, and a failed reservation removes the file."""
    error = capacity_error(directory, size)
    if error:
        return None, error
    path = directory / f"engram-{tag}-{secrets.token_hex(16)}"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return None, f"cannot create {path}: {exc.strerror}"
    try:
        os.posix_fallocate(fd, 0, round_up(max(size, 1), PAGE))
    except OSError as exc:
        os.unlink(path)
        return (
            None,
            f"cannot reserve {size:,} bytes in {directory}: {exc.strerror}; free space there or point ENGRAM_SHM_DIR elsewhere",
        )
    finally:
        os.close(fd)
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
    """Collective over `group`: every rank gets a MAP_SHARED mapping of the same `size` bytes."""
    directory = shm_dir() if directory is None else directory
    leader = group.rank == 0
    path = error = None
    if leader:
        path, error = _create(directory, size, tag)
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
    if leader:
        _unlink(announced["path"])
    failed = [(group.ranks[i], e) for i, e in enumerate(errors) if e]
    if failed:
        if mapping is not None:
            mapping.release()
        raise EngramError(f"{group.label}: " + "; ".join(f"rank {r}: {e}" for r, e in failed))
    assert mapping is not None
    return mapping
