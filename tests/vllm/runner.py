"""The differential suite's link to the real vLLM 0.33.0: `make test-vllm` installs it in a venv of its own
and points ENGRAM_VLLM_PYTHON there; elsewhere the tests marked `needs_vllm` are skipped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

VLLM_PYTHON = os.environ.get("ENGRAM_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="needs vLLM 0.33.0 in its own venv: run `make test-vllm`")


def ask_vllm(kind: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's answer to each case, from tests/vllm/vllm_side.py run by the vLLM venv's Python."""
    assert VLLM_PYTHON is not None
    done = subprocess.run(
        [VLLM_PYTHON, str(Path(__file__).with_name("vllm_side.py"))],
        input="".join(json.dumps({"kind": kind, **case}) + "\n" for case in cases),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(answers) == len(cases)
    return answers
