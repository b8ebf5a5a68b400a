"""Files engram writes where the user said (make-checkpoint --out, profile --out, --plot): written
without ever following a symlink or replacing anything but a regular file. The bytes go to a fresh
scratch name of this process's (engram.scratch) in the target's directory, opened by descriptor with
O_EXCL|O_NOFOLLOW, and are renamed over the name once whole, so a reader never sees half a file and a
link planted at the name is replaced, never written through. Whatever fails, the scratch file goes
(and one a kill left is reclaimed by the next writer there). A device node, FIFO, directory or symlink at
the name is refused rather than replaced.

A directory of several files (a checkpoint) is written only into a directory of ours that no other user
can write (OutputDirectory): another user's would let them swap a file after it is checked."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from engram.errors import EngramError
from engram.scratch import reclaim_scratch, scratch_name


def _kind(mode: int) -> str:
    return "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"


def _refusal(flag: str, path: str | Path, example: str, info: os.stat_result) -> str | None:
    if stat.S_ISREG(info.st_mode):
        return None
    if stat.S_ISDIR(info.st_mode):
        return f"{flag} {path} is a directory; name a file, e.g. {Path(path) / example}"
    return f"{flag} {path} is {_kind(info.st_mode)}; engram writes only a regular file or a new name there: choose another path"


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


def _private_problem(info: os.stat_result) -> str | None:
    """Why a directory is not fit to hold what we write (owned by another user, or writable by one)."""
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    if info.st_mode & 0o022:
        return f"has mode {info.st_mode & 0o7777:o}: other users can write into it"
    return None


class OutputDirectory:
    """A directory opened once by descriptor, whose files are written as the module docstring says.
    `private`: refuse a directory another user owns or can write (say why), for files that belong
    together; `create`: make it (mode 0755) when missing, and remove it again if the writing fails
    (close(failed=True)) while it is still empty."""

    def __init__(self, flag: str, path: str | Path, *, private: bool, create: bool = False) -> None:
        self.flag, self.path = flag, Path(path)
        self.made = False
        try:
            if create and not os.path.lexists(self.path):
                with contextlib.suppress(FileExistsError):  # made by another meanwhile: checked below
                    os.makedirs(self.path, 0o755)
                    self.made = True
            self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            linked = exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(self.path)
            why = "is a symbolic link; name the directory itself" if linked else exc.strerror
            raise EngramError(f"cannot write into {flag} {path}: {why}; choose another") from None
        except ValueError:
            raise EngramError(f"{flag} {str(path)[:200]!a} is not a usable name (it holds a NUL byte)") from None
        problem = _private_problem(os.fstat(self.fd)) if private else None
        if problem:
            os.close(self.fd)
            raise EngramError(
                f"{flag} {path} {problem}, so files written there could be swapped after they are checked; "
                "choose a directory only you can write (or make it: engram creates a missing one)"
            )
        with contextlib.suppress(OSError):
            reclaim_scratch(Path(self.where("")))  # what a writer killed half-way left

    def where(self, name: str) -> str:
        """A path to `name` inside the directory through its descriptor, for writers that take a path."""
        return f"/proc/self/fd/{self.fd}/{name}"

    @contextlib.contextmanager
    def staged(self, name: str) -> Iterator[str]:
        """A fresh scratch name for `name` in the directory, for the body to write (where() gives a path to
        it), renamed over `name` when the body returns; removed if anything fails."""
        self._refuse_odd(name)
        scratch = scratch_name(name[:200])
        try:
            yield scratch
            self._refuse_odd(name)  # the name may have changed meanwhile
            os.replace(scratch, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(scratch, dir_fd=self.fd)

    def write(self, name: str, data: bytes) -> None:
        """`data` as the file `name`, created O_EXCL|O_NOFOLLOW under a scratch name, then renamed."""
        with self.staged(name) as scratch:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            with os.fdopen(os.open(scratch, flags, 0o644, dir_fd=self.fd), "wb") as f:
                f.write(data)

    def _refuse_odd(self, name: str) -> None:
        """Refuse unless `name` is absent or a regular file (a link is refused, never followed)."""
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mode
            if not stat.S_ISREG(mode):
                raise EngramError(
                    f"{self.path / name} is {_kind(mode)}, where engram writes a file of that name: move it away, "
                    "or write elsewhere"
                )

    def close(self, *, failed: bool = False) -> None:
        """Close the descriptor; after a failure, a directory this made and left empty goes too."""
        if failed and self.made:
            with contextlib.suppress(OSError):
                os.rmdir(self.path)  # only if still empty, and only the one we made
        os.close(self.fd)

    def __enter__(self) -> OutputDirectory:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        self.close(failed=kind is not None)


def write_output(flag: str, path: str | Path, data: bytes) -> None:
    """`data` as the file `path`, atomically, under the rules above (checked again here: the name may
    have changed since check_output_path)."""
    target = Path(path)
    try:
        with OutputDirectory(flag, target.parent, private=False) as directory:
            directory.write(target.name, data)
    except OSError as exc:
        raise EngramError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
