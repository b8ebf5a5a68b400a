"""The differential suite's link to a real vLLM release: `make test-vllm` installs each one it runs against
(0.33.0 and 0.34.0) in a venv of its own and points ENGRAM_VLLM_PYTHON there; elsewhere the tests marked
`needs_vllm` are skipped. `vllm_version()` says which release it is, for the cases that differ."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

VLLM_PYTHON = os.environ.get("ENGRAM_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="needs vLLM in its own venv: run `make test-vllm`")


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


@functools.cache
def vllm_version() -> tuple[int, int]:
    """(major, minor) of the vLLM in ENGRAM_VLLM_PYTHON's venv."""
    [answer] = ask_vllm("version", [{}])
    major, minor = answer["version"].split(".")[:2]
    return int(major), int(minor)
