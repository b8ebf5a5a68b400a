"""A command started with its standard output closed (`engram schema >&-`) says so on stderr and exits 2:
Python hands such a process None for sys.stdout, which no writer may touch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("command", [["schema"], ["validate", "--json", "README.md"], ["--help"]])
def test_a_closed_stdout_is_one_line_on_stderr(command: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engram", *command],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr == "error: standard output is closed; give the command somewhere to write (a file, a pipe)\n"


def test_closed_stdout_and_stderr_exit_2_without_a_word() -> None:
    def close_both() -> None:
        os.close(1)
        os.close(2)

    done = subprocess.run(
        [sys.executable, "-m", "engram", "schema"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        timeout=120,
        preexec_fn=close_both,
    )
    assert done.returncode == 2
