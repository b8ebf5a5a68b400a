"""A second, unprivileged user on this machine for the multi-user tests: a uid no account uses, running
the system's stdlib-only Python (the project's venv may sit where that uid cannot read). Tests that need
one are skipped with the reason when this process cannot switch users."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

UID = GID = 54_321  # an unused uid: its files are nobody's but the test's


@dataclass(frozen=True)
class OtherUser:
    uid: int
    gid: int
    python: str

    def popen(self, code: str, *args: str) -> subprocess.Popen[str]:
        """`python -c code args...` as this user, in the background (stdout a pipe)."""
        return subprocess.Popen(
            [self.python, "-c", code, *args],
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def run(self, code: str, *args: str, timeout: float = 60) -> str:
        with self.popen(code, *args) as proc:
            out, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, err
        return out


def _python() -> str | None:
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and Path(candidate).exists():
            done = subprocess.run(
                [candidate, "-c", "print(1)"], user=UID, group=GID, extra_groups=[], capture_output=True, timeout=30
            )
            if done.returncode == 0:
                return candidate
    return None


@pytest.fixture(scope="session")
def other_user() -> OtherUser:
    if os.geteuid() != 0:
        pytest.skip("switching to a second user needs root")
    python = _python()
    if python is None:
        pytest.skip(f"no Python that uid {UID} can run")
    return OtherUser(UID, GID, python)


@pytest.fixture
def open_directory() -> Iterator[Callable[[int], Path]]:
    """Makes directories everyone can write (mode 0o777, or 0o1777 with the sticky bit), like a careless
    ENGRAM_SHM_DIR or ENGRAM_CACHE_DIR, on /dev/shm (or /tmp), where the other user can reach them."""
    made: list[Path] = []

    def make(mode: int) -> Path:
        root = "/dev/shm" if Path("/dev/shm").is_dir() else "/tmp"
        path = Path(tempfile.mkdtemp(prefix="engram-open-", dir=root))
        os.chmod(path, mode)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)
