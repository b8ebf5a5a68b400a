"""The SGLang suite's link to the real SGLang release: `make test-sglang` installs it (0.5.23) in a venv of
its own, with engram beside it, and points ENGRAM_SGLANG_PYTHON there; elsewhere the tests marked
`needs_sglang` are skipped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

SGLANG_PYTHON = os.environ.get("ENGRAM_SGLANG_PYTHON")
needs_sglang = pytest.mark.skipif(not SGLANG_PYTHON, reason="needs SGLang in its own venv: run `make test-sglang`")


def ask_sglang(kind: str, cases: list[dict[str, Any]], env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """SGLang's answer to each case, from tests/sglang/sglang_side.py run by the SGLang venv's Python."""
    assert SGLANG_PYTHON is not None
    done = subprocess.run(
        [SGLANG_PYTHON, str(Path(__file__).with_name("sglang_side.py"))],
        input="".join(json.dumps({"kind": kind, **case}) + "\n" for case in cases),
        capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(cases), done.stderr[-4000:]
    return answers
