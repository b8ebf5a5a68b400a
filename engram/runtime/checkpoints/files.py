"""Files users hand the runtime (checkpoints, their SHA256SUMS, profiles): only regular files are read,
since a FIFO would block forever and a directory or a dangling link fail late. Each is opened without
blocking (a FIFO swapped in after a check cannot hang the open) and checked by its descriptor, so what is
read is what was checked. Small text files are read with a size bound and a clear error for bytes that
are not UTF-8."""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import stat
from pathlib import Path

from engram.errors import EngramError


def check_regular(path: Path, what: str) -> None:
    """Raise unless `path` is a regular file (following links); `what` names it in the message."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise EngramError(f"{what} {path} cannot be read: {exc.strerror} (a dangling link?)") from None
    except ValueError:
        raise EngramError(f"{what} {str(path)[:200]!a} is not a usable file name (it holds a NUL byte)") from None
    if not stat.S_ISREG(mode):
        raise EngramError(f"{what} {path} is {_kind(mode)}; it must be a regular file")


def _kind(mode: int) -> str:
    return "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"


def open_regular(path: Path, what: str) -> int:
    """A read-only descriptor of `path` (links followed), refused unless what it opened is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise EngramError(f"{what} {path} cannot be read: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the name
        raise EngramError(f"{what} {str(path)[:200]!a} is not a usable file name (it holds a NUL byte)") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise EngramError(f"{what} {path} is {_kind(mode)}; it must be a regular file")
    return fd


def read_text(path: Path, what: str, limit: int) -> str:
    """A regular file of at most `limit` bytes, as UTF-8 text."""
    try:
        with os.fdopen(open_regular(path, what), "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise EngramError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise EngramError(f"{what} {path} is larger than {limit:,} bytes; it cannot be the file engram expects")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EngramError(f"{what} {path} is not UTF-8 text (byte {exc.start:,}); write it again") from None


F_SETLEASE, F_SETSIG = 1024, 10  # <linux/fcntl.h>


def open_for_writing(fd: int) -> bool | None:
    """Whether any process, in any namespace, has the file of read-only descriptor `fd` open for writing
    or mapped writable (the kernel refuses a read lease on such an inode: it counts its writers); None
    where that cannot be asked (a file neither ours nor leasable by us, a file system without leases).
    The lease is dropped at once; in that instant, another process opening the file for writing waits
    for it, and the lease break's signal is SIGURG, which by default does nothing (not SIGIO, which
    kills)."""
    try:
        fcntl.fcntl(fd, F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
    except OSError as exc:
        return True if exc.errno == errno.EAGAIN else None
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
    return False
