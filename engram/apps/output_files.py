"""Files a command writes where the user said (--out, --plot): checked before any work, and written
without ever following a symlink or replacing anything but a regular file. The bytes go to a new file
of ours in the target's directory (opened by descriptor, O_EXCL), renamed over the name at the end, so
a reader never sees half a file, and a device node, FIFO, directory or a symlink's target at the name
is refused rather than replaced."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from engram.errors import EngramError


def _refusal(flag: str, path: str | Path, example: str, info: os.stat_result) -> str | None:
    if stat.S_ISREG(info.st_mode):
        return None
    if stat.S_ISDIR(info.st_mode):
        return f"{flag} {path} is a directory; name a file, e.g. {Path(path) / example}"
    kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
    return f"{flag} {path} is {kind}; engram writes only a regular file or a new name there: choose another path"


def check_output_path(flag: str, path: str | Path, example: str) -> None:
    """A file a command will write, checked before the work that produces it: a new name or a regular
    file (never followed if a link), in a directory that exists (`example` names a file to suggest)."""
    target = Path(path)
    try:
        refusal = _refusal(flag, path, example, os.lstat(target))
    except FileNotFoundError:
        refusal = None
    except (OSError, ValueError) as exc:
        refusal = f"{flag} {path}: {getattr(exc, 'strerror', None) or exc}"
    if refusal:
        raise EngramError(refusal)
    if not target.parent.is_dir():
        raise EngramError(f"{flag} {path}: the directory {target.parent} does not exist; create it or choose another")


def write_output(flag: str, path: str | Path, data: bytes, example: str = "out") -> None:
    """`data` as the file `path`, atomically, under the rules above (checked again here: the name may
    have changed since check_output_path)."""
    target = Path(path)
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise EngramError(f"cannot write {flag} {path}: {exc.strerror}") from None
    tmp = f".{target.name[:200]}.{secrets.token_hex(8)}.tmp"
    try:
        with contextlib.suppress(FileNotFoundError):
            refusal = _refusal(flag, path, example, os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False))
            if refusal:
                raise EngramError(refusal)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = ""
    except OSError as exc:
        raise EngramError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        os.close(dir_fd)
