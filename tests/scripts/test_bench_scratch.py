"""benchmarks/_scratch.py: a benchmark's scratch directory goes when it ends, and one that a killed
benchmark left is removed by the next, while a live benchmark's is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
from _scratch import scratch_dir  # noqa: E402

HOLDER = """
import sys, time
sys.path.insert(0, {benchmarks!r})
from _scratch import scratch_dir
with scratch_dir() as path:
    (path / "table.bin").write_bytes(bytes(1 << 20))
    print(path, flush=True)
    time.sleep(120)
"""


def holder(root: Path) -> tuple[subprocess.Popen[str], Path]:
    """A child inside scratch_dir(), and its directory."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(benchmarks=str(BENCHMARKS))],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "ENGRAM_BENCH_DIR": str(root)},
    )  # fmt: skip
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def test_a_killed_benchmarks_files_go_with_the_next_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_BENCH_DIR", str(tmp_path))
    killed, left = holder(tmp_path)
    alive, kept = holder(tmp_path)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=30)
        assert (left / "table.bin").stat().st_size == 1 << 20  # SIGKILL: no cleanup ran
        with scratch_dir() as mine:
            assert mine.parent == tmp_path and mine.name.startswith("engram-bench-")
            assert sorted(tmp_path.iterdir()) == sorted([kept, mine])  # the dead one's gone, the live one's kept
        assert sorted(tmp_path.iterdir()) == [kept]
    finally:
        for child in (killed, alive):
            child.kill()
            child.wait(timeout=30)
            if child.stdout is not None:
                child.stdout.close()
