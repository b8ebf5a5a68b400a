"""Files named for the process that made them, so that what a kill -9 leaves behind (a half-written
temporary file, a table between its creation and its hand-over) is known for stale and removed by the
next run: the name carries the boot, the pid namespace, the pid and that pid's start time, and its
owner is gone when no process of that pid started then. A name of another boot or pid namespace says
nothing about ours and is left alone; so is anything of another user, and anything not a regular file
or directory (a link is never anyone's).

A start time is read from /proc/PID/stat, which shifts it by the reader's time namespace (its boot-time
offset): names carry it as the initial time namespace sees it, each side taking off its own offset. A name
whose owner cannot be told for certain is left alone: where /proc is not this pid namespace's own (a pid
there names another process), where the offset cannot be read exactly, or where the writer could not
tell either (its name then carries pid namespace 0)."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

TEMPORARY = ".engram-tmp-"  # what marks a scratch name: .<stem>.engram-tmp-<owner>-<random><suffix>
_SCRATCH = re.compile(r"\.engram-tmp-([0-9a-f]+-[0-9]+-[0-9]+-[0-9]+-[0-9a-f]{16})(?:\.[A-Za-z0-9]{1,16})?\Z")
UNKNOWN = "0"  # the pid namespace in a name whose owner no one can tell: never reclaimed


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def _boot_tag() -> str | None:
    tag = boot_id().replace("-", "")[:12]
    return tag if tag and all(c in "0123456789abcdef" for c in tag) else None


def pid_namespace() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid): a pid means something only there."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return UNKNOWN


def proc_is_ours() -> bool:
    """Whether /proc is this pid namespace's own, so that /proc/PID is our PID (after `unshare --pid
    --fork` without --mount-proc it is the parent namespace's, where our pids name other processes)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return False
        return os.stat("/proc/1/ns/pid").st_ino == os.stat("/proc/self/ns/pid").st_ino
    except PermissionError:  # init's namespace is not ours to read (not root): /proc/self agreed
        return True
    except OSError:
        return False


def _boottime_offset_ticks() -> int | None:
    """The boot-time offset of this process's time namespace in clock ticks (0 outside one): what
    /proc/PID/stat adds to every start time it shows us. None where it cannot be known exactly."""
    try:
        if os.readlink("/proc/self/ns/time") != os.readlink("/proc/self/ns/time_for_children"):
            return None  # we unshared a namespace we are not in: timens_offsets shows our children's
        text = Path("/proc/self/timens_offsets").read_text()
    except FileNotFoundError:
        return 0  # a kernel without time namespaces
    except OSError:
        return None
    tick_ns = 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0] == "boottime":
            with contextlib.suppress(ValueError):
                offset_ns = int(fields[1]) * 1_000_000_000 + int(fields[2])
                return offset_ns // tick_ns if offset_ns % tick_ns == 0 else None
            return None
    return None


def start_time(pid: int | str) -> int | None:
    """The process's start time in clock ticks since boot as the initial time namespace counts them
    (field 22 of /proc/PID/stat, less our time namespace's offset): with the pid, it names a process
    uniquely, even after the pid is reused. None where it cannot be read (no such process, or the offset
    is unknown)."""
    offset = _boottime_offset_ticks()
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return None if offset is None else int(text[text.rindex(")") + 2 :].split()[19]) - offset


def _namespaces() -> tuple[str, str] | None:
    """(boot tag, pid namespace) of names this process makes and judges; None where it can tell no
    owner for certain (module docstring)."""
    boot, pidns = _boot_tag(), pid_namespace()
    if boot is None or pidns == UNKNOWN or not proc_is_ours() or _boottime_offset_ticks() is None:
        return None
    return boot, pidns


def owner_tag() -> str:
    """<boot>-<pid namespace>-<pid>-<start>: this process, as names made by it carry it (pid namespace 0
    where no one could tell it gone)."""
    known, start = _namespaces(), start_time("self")
    if known is None or start is None:
        return f"{_boot_tag() or UNKNOWN}-{UNKNOWN}-{os.getpid()}-0"
    return f"{known[0]}-{known[1]}-{os.getpid()}-{start}"


def owner_gone(name: str) -> bool:
    """Whether `name` ends in -<owner_tag>-<random> of a process of this boot and pid namespace that is
    certainly no longer running (False for any name it cannot read that way, and wherever it cannot be
    told for certain)."""
    parts = name.rsplit("-", 5)
    if len(parts) != 6 or parts[2] == UNKNOWN or _namespaces() != (parts[1], parts[2]):
        return False
    pid, start = parts[3], parts[4]
    if not (pid.isascii() and pid.isdigit() and len(pid) <= 10 and start.isascii() and start.isdigit()):
        return False
    if not Path(f"/proc/{pid}").exists():
        return True  # no process has that pid now
    now = start_time(pid)
    return now is not None and str(now) != start  # None: it exited as we looked, or cannot be read: leave it


def scratch_name(stem: str, suffix: str = "") -> str:
    """A fresh temporary name for a file that becomes `stem` (renamed over it once whole)."""
    return f".{stem}{TEMPORARY}{owner_tag()}-{secrets.token_hex(8)}{suffix}"


def reclaim_scratch(directory: Path) -> list[str]:
    """Remove this user's scratch files and directories in `directory` whose makers are gone; the names
    removed."""
    removed = []
    uid = os.geteuid()
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                name = entry.name
                made = _SCRATCH.search(name)
                if not name.startswith(".") or made is None:
                    continue
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if info.st_uid != uid or not owner_gone(f"x-{made.group(1)}"):
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        shutil.rmtree(name, dir_fd=dir_fd)  # by descriptor: no link inside is followed
                    elif stat.S_ISREG(info.st_mode):
                        os.unlink(name, dir_fd=dir_fd)
                    else:
                        continue
                    removed.append(name)
    finally:
        os.close(dir_fd)
    return sorted(removed)
