"""Hostile text in every string position of a schema never becomes code (issue 23): hypothesis draws it
(tests/codegen/hostile_child.py) in a child process whose payloads would write a canary file; the child
must finish every example, and the canary must not exist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_hostile_text_in_every_string_position_never_runs(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "codegen" / "hostile_child.py"), str(canary), "150"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "150"
    assert not canary.exists()
