"""The per-user cache (ENGRAM_CACHE_DIR, default ~/.cache/engram): built kernel libraries, the
tokenized corpus, vocabulary lookups and demo checkpoints. What is read back from it is only what this
user (or root) wrote: every directory is checked to be ours and writable by nobody else, every file is
opened by descriptor without following a symlink and checked the same way before it is used (a library
is loaded through that descriptor). A cache root that others can write gets a private `user-<uid>`
directory inside it. A bad entry (truncated, corrupt, not ours) is a miss, rebuilt, never fatal."""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from engram.errors import EngramError
from engram.scratch import reclaim_scratch, scratch_name

T = TypeVar("T")
FIX = "point ENGRAM_CACHE_DIR at a directory only you can write"


def _trusted(info: os.stat_result) -> bool:
    """Owned by us or root, and writable by no one else."""
    return info.st_uid in (os.geteuid(), 0) and not info.st_mode & 0o022


def untrusted_reason(info: os.stat_result, kind: str) -> str | None:
    if kind == "directory" and not stat.S_ISDIR(info.st_mode):
        return "is not a directory (a symlink is not followed)"
    if kind == "file" and not stat.S_ISREG(info.st_mode):
        return "is not a regular file (a symlink is not followed)"
    if not _trusted(info):
        return f"is owned by uid {info.st_uid} with mode {info.st_mode & 0o7777:o}: another user can write it"
    return None


def _private(path: Path) -> Path:
    """`path` as a directory of ours (made 0700 if missing), or EngramError naming what is wrong with it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    try:
        info = os.lstat(path)
    except OSError as exc:
        raise EngramError(f"cannot use the cache directory {path}: {exc.strerror}; {FIX}") from None
    why = untrusted_reason(info, "directory")
    if why:
        raise EngramError(f"the cache directory {path} {why}; {FIX}")
    return path


def cache_root() -> Path:
    """ENGRAM_CACHE_DIR (or ~/.cache/engram) when it is ours, else our own directory inside it."""
    root = Path(os.environ.get("ENGRAM_CACHE_DIR") or Path.home() / ".cache" / "engram")
    with contextlib.suppress(FileExistsError, PermissionError):
        root.mkdir(mode=0o700, parents=True)
    try:
        info = os.lstat(root)
    except OSError as exc:
        raise EngramError(f"cannot use the cache directory {root}: {exc.strerror}; {FIX}") from None
    if stat.S_ISDIR(info.st_mode) and _trusted(info) and info.st_uid == os.geteuid():
        return root
    return _private(root / f"user-{os.geteuid()}")


def cache_subdir(name: str) -> Path:
    """A checked directory of the cache for one kind of entry ("build", "corpus", ...)."""
    return _private(cache_root() / name)


def open_trusted(path: Path) -> int:
    """A read-only descriptor of `path`, a regular file of ours in a directory of ours; EngramError
    naming what is wrong otherwise (FileNotFoundError when it is simply absent)."""
    why = untrusted_reason(os.lstat(path.parent), "directory")
    if why:
        raise EngramError(f"{path.parent} {why}; nothing in it is read")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    why = untrusted_reason(os.fstat(fd), "file")
    if why:
        os.close(fd)
        raise EngramError(f"{path} {why}; it is not read")
    return fd


def load_library(path: Path) -> ctypes.CDLL:
    """dlopen a kernel library through a checked descriptor: never one another user can write or swap."""
    try:
        fd = open_trusted(path)
    except OSError as exc:
        raise EngramError(f"cannot open the kernel library {path}: {exc.strerror}") from None
    # The descriptor stays open: the dynamic linker knows a library by its name first, and a number that
    # was closed and reused would name another library, which dlopen would take for this one.
    try:
        return ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError as exc:
        os.close(fd)
        raise EngramError(f"cannot load the kernel library {path}: {exc}") from None


def read_cached(path: Path, load: Callable[[BinaryIO], T]) -> T | None:
    """`load` of the cache entry at `path`, or None when it is absent, not ours, or unreadable (a bad
    entry is removed, so the rebuilt one replaces it)."""
    try:
        fd = open_trusted(path)
    except (OSError, EngramError):
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return load(f)
    except Exception:
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def save_cached(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a cache entry atomically (a new file of ours, then a rename: readers never see half a
    file), best effort: a read-only or full cache only costs a rebuild next time."""
    tmp = None
    try:
        reclaim_scratch(path.parent)  # what a writer killed half-way left
        tmp = path.parent / scratch_name(path.name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
