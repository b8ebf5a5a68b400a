"""Files users hand the runtime (checkpoints, their SHA256SUMS, profiles): only regular files are opened,
since a FIFO would block forever and a directory or a dangling link fail late, and small text files are read
with a size bound and a clear error for bytes that are not UTF-8."""

from __future__ import annotations

import stat
from pathlib import Path

from engram.errors import EngramError


def check_regular(path: Path, what: str) -> None:
    """Raise unless `path` is a regular file (following links); `what` names it in the message."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise EngramError(f"{what} {path} cannot be read: {exc.strerror} (a dangling link?)") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise EngramError(f"{what} {path} is {kind}; it must be a regular file")


def read_text(path: Path, what: str, limit: int) -> str:
    """A regular file of at most `limit` bytes, as UTF-8 text."""
    check_regular(path, what)
    try:
        with path.open("rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise EngramError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if len(data) > limit:
        raise EngramError(f"{what} {path} is larger than {limit:,} bytes; it cannot be the file engram expects")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EngramError(f"{what} {path} is not UTF-8 text (byte {exc.start:,}); write it again") from None
