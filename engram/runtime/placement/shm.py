"""One host copy of a table shard shared by the data-parallel replicas of a node (dp_shared_memory).

The group is the node-local DP replicas at one TP rank, its rank 0 the leader. By default the table is an
anonymous memfd, which no crash can leak: the kernel frees it when the last process holding it (an fd or
a mapping) is gone. (1) The ranks exchange uid and node identity. (2) The leader checks capacity against
the node's memory, creates the memfd, reserves the space with posix_fallocate (a sparse table would die
with SIGBUS when memory runs out) and listens on an abstract Unix socket under an unpredictable name
(abstract names vanish with their socket). (3) It broadcasts the name and a token, or its error. (4) Each
peer connects, sends the token and receives the fd (SCM_RIGHTS); the leader's hand-off thread drops any
other uid's connection before reading from it (SO_PEERCRED) and serves its own uid's side by side, so no
stranger can stall it. (5) Every rank maps it; the ranks all-gather their errors, the fence after which
the socket closes; a peer that failed reaches the fence at once, so its leader knows at once. Every wait
is bounded by the group's timeout.

With ENGRAM_SHM_DIR set (a hugetlbfs mount, a tmpfs of its own) the table is a named file there instead:
created O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, reserved with posix_fallocate, and mapped by the leader
through the descriptor it created. The peers open the broadcast name without following a symlink or
blocking on a FIFO and map it only if it is the leader's inode (device, inode, owner, mode 0600), so a
name replaced by another user in a directory they can write gets neither our rows nor our writes. The
leader unlinks it after the fence (only while it still names its inode). Its name records its owner (boot
id, pid namespace, pid, process start time), so a file of ours that a crash left between creation and the
fence is reclaimed by the next start in that directory, or by `engram doctor --clean`; other users' files
and files of other pid namespaces are never touched. Loading writes from the leader only, with a barrier
after each weight-loader call (loader.py)."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from engram.errors import EngramError
from engram.memory.host import HostLimits
from engram.memory.mapping import Mapping, map_shared_file
from engram.runtime.dist import Group, all_gather_json, broadcast_json
from engram.runtime.placement.memfd import capacity_error as memfd_capacity_error
from engram.runtime.placement.memfd import share_memfd
from engram.runtime.placement.node_memory import GIB, fenced, node_of_this_process, reserve
from engram.scratch import owner_gone, owner_tag


def shm_dir() -> Path:
    """ENGRAM_SHM_DIR, default /dev/shm (tests point it at a small tmpfs)."""
    return Path(os.environ.get("ENGRAM_SHM_DIR") or "/dev/shm")


def uses_memfd() -> bool:
    """Shared tables are anonymous memfds unless ENGRAM_SHM_DIR names a directory for them."""
    return not os.environ.get("ENGRAM_SHM_DIR")


def _open_directory(directory: Path) -> int:
    return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def _stale_names(dir_fd: int) -> list[str]:
    """Names of this user's named shared tables in the open directory whose creator is gone
    (engram.scratch.owner_gone: same boot and pid namespace, and no live process with its pid and start
    time). Other users' files are theirs to reclaim; regular files and directories (a benchmark's
    scratch) are considered, never a symlink."""
    uid = os.geteuid()
    found = []
    with os.scandir(dir_fd) as entries:
        for entry in entries:  # engram-<tag>-<boot>-<pidns>-<pid>-<start>-<random>
            if not entry.name.startswith("engram-") or not owner_gone(entry.name):
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            kind_ok = stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)  # a link is never anyone's
            if kind_ok and info.st_uid == uid:
                found.append(entry.name)
    return sorted(found)


def stale_files(directory: Path) -> list[Path]:
    """Named shared tables in `directory` that a crash between creation and the fence left behind."""
    dir_fd = _open_directory(directory)
    try:
        return [directory / name for name in _stale_names(dir_fd)]
    finally:
        os.close(dir_fd)


def _reclaim(dir_fd: int, directory: Path) -> list[Path]:
    """Unlink this user's stale files (a directory is left to its own owner's clean-up)."""
    removed = []
    for name in _stale_names(dir_fd):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            os.unlink(name, dir_fd=dir_fd)
            removed.append(directory / name)
    return removed


def reclaim_stale(directory: Path) -> list[Path]:
    """Remove stale_files(directory); returns what was removed (a file already gone is not an error).
    Raises EngramError when the directory cannot be read."""
    try:
        dir_fd = _open_directory(directory)
    except OSError as exc:
        raise EngramError(
            f"cannot open {directory}: {exc.strerror}; point ENGRAM_SHM_DIR at a directory of yours"
        ) from None
    try:
        return _reclaim(dir_fd, directory)
    finally:
        os.close(dir_fd)


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


def _create(directory: Path, size: int, tag: str) -> tuple[int | None, str, str | None]:
    """The leader's step 1: (fd, name, None) or (None, name, error). The file is made in the directory
    opened once (O_EXCL, no symlink followed), and the leader keeps its descriptor: what it writes goes
    to the inode it created, whatever is renamed over the name. Nothing is written before the space is
    reserved, and a failed reservation removes the file."""
    name = f"engram-{tag}-{owner_tag()}-{secrets.token_hex(16)}"
    try:
        dir_fd = _open_directory(directory)
    except OSError as exc:
        return (
            None,
            name,
            f"cannot use {directory} for shared tables: {exc.strerror}; point ENGRAM_SHM_DIR at a writable tmpfs",
        )
    try:
        _reclaim(dir_fd, directory)
        error = capacity_error(directory, size)
        if error:
            return None, name, error
        flags = os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW
        try:
            fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            return (
                None,
                name,
                f"cannot create {directory / name}: {exc.strerror}; point ENGRAM_SHM_DIR at a writable tmpfs",
            )
        failed = reserve(fd, size)
        if failed:
            info = os.fstat(fd)
            os.close(fd)
            _unlink(directory, name, (info.st_dev, info.st_ino))
            return (
                None,
                name,
                f"cannot reserve {size:,} bytes in {directory}: {failed}; free space there or point ENGRAM_SHM_DIR elsewhere",
            )
        return fd, name, None
    finally:
        os.close(dir_fd)


def _foreign(info: os.stat_result, leader: dict[str, Any]) -> str | None:
    """Why the file a peer opened is not the one its leader created, or None."""
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if (info.st_dev, info.st_ino) != (leader["device"], leader["inode"]):
        return "is not the file its leader created (the name was replaced)"
    if info.st_uid != leader["uid"] or info.st_mode & 0o077:
        return f"is owned by uid {info.st_uid} with mode {info.st_mode & 0o777:o}, not the leader's private file"
    return None


def _attach(directory: Path, size: int, leader: dict[str, Any], group: Group) -> tuple[Mapping | None, str | None]:
    """A peer's step 2: open the leader's file by its name in the directory, without following a
    symlink or blocking on a FIFO, and map it only if it is the inode the leader created, still private."""
    rank = group.ranks[group.rank]
    mine = node_identity(directory)
    if mine["boot_id"] != leader["boot_id"]:
        return (
            None,
            f"rank {rank} runs on another node than its leader (boot id differs); dp_shared_memory needs data_parallel_size_local to match the replicas per node",
        )
    if mine["shm_device"] != leader["shm_device"]:
        return (
            None,
            f"rank {rank} sees another {directory} than its leader (a separate IPC or mount namespace); run the replicas with --ipc=host or one shared /dev/shm",
        )
    path = directory / leader["name"]
    flags = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        dir_fd = _open_directory(directory)
        try:
            fd = os.open(leader["name"], flags, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except FileNotFoundError:
        return (
            None,
            f"rank {rank} cannot see {path}: the replicas do not share {directory} (separate IPC namespaces?); run them with --ipc=host",
        )
    except OSError as exc:
        return (
            None,
            f"rank {rank} cannot open {path}: {exc.strerror} (was it replaced?); give ENGRAM_SHM_DIR a directory only you can write",
        )
    try:
        info = os.fstat(fd)
        why = _foreign(info, leader)
        if why:
            return None, f"rank {rank}: {path} {why}; give ENGRAM_SHM_DIR a directory only you can write"
        if info.st_size < size:
            return None, f"{path} is smaller than the table ({info.st_size:,} < {size:,} bytes)"
        return map_shared_file(fd, size, str(path)), None
    except EngramError as exc:
        return None, str(exc)
    finally:
        os.close(fd)


def _unlink(directory: Path, name: str, identity: tuple[int, int]) -> None:
    """Remove the leader's name if it still names the leader's inode (`identity`): another user's file
    renamed over it is not ours to remove."""
    with contextlib.suppress(OSError):
        dir_fd = _open_directory(directory)
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if (info.st_dev, info.st_ino) == identity:
                os.unlink(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)


def create_shared(size: int, group: Group, tag: str, directory: Path | None = None) -> Mapping:
    """Collective over `group`: every rank gets a MAP_SHARED mapping of the same `size` bytes, of an
    anonymous memfd (default) or of a named file in `directory` / ENGRAM_SHM_DIR."""
    if directory is None and uses_memfd():
        return share_memfd(size, group, tag)
    directory = shm_dir() if directory is None else directory
    fd: int | None = None
    name = error = None
    identity: tuple[int, int] | None = None
    announced: dict[str, Any] = {}
    if group.rank == 0:
        fd, name, error = _create(directory, size, tag)
        if fd is not None:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            announced = {"device": info.st_dev, "inode": info.st_ino, "uid": info.st_uid}
    try:
        announced = broadcast_json(
            group,
            {"name": name, "error": error, **announced, **node_identity(directory)} if group.rank == 0 else None,
            f"shared table {tag}: announce",
        )
        if announced["error"]:
            raise EngramError(
                f"{group.label}: leader rank {group.ranks[0]} could not create the shared table {tag}: {announced['error']}"
            )
        mapping = None
        if fd is not None:
            try:
                mapping, error = map_shared_file(fd, size, str(directory / announced["name"])), None
            except EngramError as exc:
                error = str(exc)
        else:
            mapping, error = _attach(directory, size, announced, group)
        try:
            errors = all_gather_json(group, error, f"shared table {tag}: attach")  # the fence
        except EngramError:
            # a peer died before the fence: whoever is left removes the name
            _unlink(directory, announced["name"], (announced["device"], announced["inode"]))
            raise
    finally:
        if fd is not None:
            os.close(fd)  # the mappings keep the memory
        if identity is not None:
            _unlink(directory, name or "", identity)  # after the fence, or on any failure
    return fenced(group, errors, mapping)
