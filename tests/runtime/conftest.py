"""Fixtures for the runtime tests: the small model's checkpoint (tests.runtime.specs.SMALL), a private shm
directory."""

from __future__ import annotations

import shutil
import tempfile
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
