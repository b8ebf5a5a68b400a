"""Fixtures for the runtime tests: the small model's checkpoint (tests.runtime.specs.SMALL), a private shm
directory, memory cgroups for simulated pods."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.runtime.checkpoints.writer import write_checkpoint
from tests.runtime.specs import SMALL


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt-small")
    write_checkpoint(SMALL, out, seed=7)
    return out


@pytest.fixture
def shm_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private shm directory (on the same tmpfs-backed /dev/shm when possible)."""
    base = Path("/dev/shm")
    root = base if base.is_dir() and base.stat().st_mode & 0o002 else tmp_path
    directory = Path(tempfile.mkdtemp(prefix="engram-test-", dir=root))  # unique even beside a killed run's
    monkeypatch.setenv("ENGRAM_SHM_DIR", str(directory))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def cgroups() -> Iterator[list[Path]]:
    """Four memory cgroups below ours (cgroup v1's memory controller, or v2), removed after."""
    lines = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    root = (
        Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/") if v1 else Path("/sys/fs/cgroup") / lines[-1][2].lstrip("/")
    )
    made = []
    try:
        for i in range(4):
            made.append(root / f"engram-test-pod-{os.getpid()}-{i}")
            made[-1].mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make memory cgroups here: {exc}")
    yield made
    for cgroup in made:
        deadline = time.monotonic() + 30
        while cgroup.exists():
            try:
                cgroup.rmdir()
            except OSError:
                assert time.monotonic() < deadline, f"{cgroup} kept its processes"
                time.sleep(0.05)
