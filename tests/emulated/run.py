"""The child process that runs tests/emulated/cases.py with AddressSanitizer's runtime preloaded, started
early (tests/conftest.py starts it once collection has picked its test, so it runs on the second core
beside the suite) and killed at the session's end if its test never ran."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.emulated.library import asan_runtime

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


class EmulatedRun:
    """The child running tests/emulated/cases.py, its output in a file (a pipe nobody reads could fill)."""

    def __init__(self, runtime: str) -> None:
        env = {
            **os.environ,
            "LD_PRELOAD": runtime,
            "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=97",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
        }
        self.output = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in finish(), after the child
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--capture=sys",
                   str(ROOT / "tests/emulated/cases.py")]  # fmt: skip
        self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self.output, stderr=subprocess.STDOUT)

    def finish(self) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait(timeout=60)
        with self.output:
            self.output.seek(0)
            return code, self.output.read()


started: list[EmulatedRun] = []


def start_early() -> None:
    """Start the child now (tests/conftest.py calls this once collection has picked this test)."""
    runtime = asan_runtime()
    if runtime is not None and not started:
        started.append(EmulatedRun(runtime))


def stop_unfinished() -> None:
    """At the session's end: a child whose test never ran (deselected after start, -x) is killed."""
    while started:
        run = started.pop()
        run.process.kill()
        run.finish()
