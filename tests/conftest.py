"""Shared fixtures. Tests never depend on the caller's environment: Engram variables are cleared."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.other_user import open_directory, other_user  # noqa: F401 (fixtures every test may ask for)


@pytest.fixture(autouse=True)
def _clean_engram_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENGRAM_CPU_OFFLOAD", "VLLM_PLE_CPU_OFFLOAD", "ENGRAM_SHM_DIR"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def memory_short(monkeypatch: pytest.MonkeyPatch) -> None:
    """No memory left, as a RAM tier sees it: it serves (where memory is to spare it stands aside)."""
    from engram.runtime.tiers import ram

    monkeypatch.setattr(ram, "free_bytes_now", lambda: 0)


@pytest.fixture
def small_tmpfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], Path]]:
    """Mounts a tmpfs of the size given ("1m", "64k") under tmp_path and points ENGRAM_SHM_DIR at it
    (skipped where this process cannot mount one); unmounted after the test."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        where = tmp_path / f"tmpfs-{len(mounted)}"
        where.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        monkeypatch.setenv("ENGRAM_SHM_DIR", str(where))
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False, timeout=30)


@pytest.fixture(scope="session")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path, Path]:
    """`engram profile` of the tiny preset, run once: its JSON report, the hot-rows file and the plot."""
    from engram.cli import main

    root = tmp_path_factory.mktemp("profile")
    out, plot = root / "hot.safetensors", root / "hits.png"
    argv = ["profile", "--preset", "tiny", "--tokens", "8192", "--held-out-tokens", "2000", "--json"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main([*argv, "--out", str(out), "--plot", str(plot)]) == 0
    return json.loads(printed.getvalue()), out, plot


def pytest_collection_finish(session: pytest.Session) -> None:
    """The emulated kernels' child process starts at once when its test is to run: it takes the second
    core while the suite runs on the first (tests/emulated/run.py)."""
    if any(item.nodeid.endswith("test_the_cuda_kernels_run_emulated_and_bounds_checked") for item in session.items):
        from tests.emulated.run import start_early

        start_early()


def pytest_sessionfinish(session: pytest.Session) -> None:
    import sys

    module = sys.modules.get("tests.emulated.run")
    if module is not None:
        module.stop_unfinished()
