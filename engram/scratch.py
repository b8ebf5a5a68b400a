"""Files named for the process that made them, so that what a kill -9 leaves behind (a half-written
temporary file, a table between its creation and its hand-over) is known for stale and removed by the
next run: the name carries the boot, the pid namespace, the pid and that pid's start time, and its
owner is gone when no process of that pid started then. A name of another boot or pid namespace says
nothing about ours and is left alone; so is anything of another user, and anything not a regular file
or directory (a link is never anyone's)."""

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


def boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid, it
    names a process uniquely, even after the pid is reused."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[19]


def pid_namespace() -> str:
    """This process's pid namespace (the inode of /proc/self/ns/pid): a pid means something only there."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _boot_tag() -> str:
    return boot_id().replace("-", "")[:12]


def owner_tag() -> str:
    """<boot>-<pid namespace>-<pid>-<start>: this process, as names made by it carry it."""
    return f"{_boot_tag()}-{pid_namespace()}-{os.getpid()}-{start_time(os.getpid())}"


def owner_gone(name: str) -> bool:
    """Whether `name` ends in -<owner_tag>-<random> of a process of this boot and pid namespace that is
    no longer running (False for any name it cannot read that way)."""
    parts = name.rsplit("-", 5)
    if len(parts) != 6 or parts[1:3] != [_boot_tag(), pid_namespace()]:
        return False
    pid = parts[3]
    if not pid.isascii() or not pid.isdigit() or len(pid) > 10:
        return False
    return start_time(int(pid)) != parts[4]


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
