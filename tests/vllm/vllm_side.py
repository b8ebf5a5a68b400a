"""Run inside the vLLM 0.33 venv (never imported by engram's tests): reads cases as JSON lines on stdin,
answers each with what vLLM's own EngramConfig says, as JSON lines on stdout."""

import json
import sys
from types import SimpleNamespace

from vllm.config.engram import EngramConfig


def reason(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError wraps the validator's ValueError
    return str(errors()[0]["ctx"]["error"]) if callable(errors) else str(exc)


def answer(case: dict) -> dict:
    try:
        config = EngramConfig(**case["engram"])
    except ValueError as exc:
        return {"constructed": False, "error": reason(exc)}
    parallel = SimpleNamespace(**case["parallel"])
    unresolved = config.compute_hash()
    config.resolve_dp_shared_memory(parallel)  # as VllmConfig does, before the parallel checks
    out = {
        "constructed": True,
        "unresolved_hash": unresolved,
        "dp_shared_memory": config.dp_shared_memory,
        "hash": config.compute_hash(),
        "parallel_size": config.get_parallel_size(parallel),
    }
    try:
        config.verify_parallel_config(parallel)
        out["parallel_error"] = None
    except ValueError as exc:
        out["parallel_error"] = reason(exc)
    return out


for line in sys.stdin:
    print(json.dumps(answer(json.loads(line))), flush=True)
