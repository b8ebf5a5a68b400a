"""engram's EngramConfig against the real vLLM 0.33.0 package (tests/vllm/runner.py): for every setting of the four
fields (dp_shared_memory true, false or null), at TP 1/2 x DP 1/4 with and without elastic EP, the same
constructor verdict and message, the same digest before and after dp_shared_memory is resolved, the same
resolution, the same verify_parallel_config verdict and message, and the same embedding group size."""

from __future__ import annotations

import itertools
from typing import Any

from engram.config import EngramConfig, ParallelConfig
from engram.errors import ConfigError
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm
FIELDS = ("cpu_offload", "embedding_across_dp", "dp_shared_memory", "use_thp")
CASES = [
    {
        "engram": dict(zip(FIELDS, values, strict=True)),
        "parallel": {"tensor_parallel_size": tp, "data_parallel_size": dp, "enable_elastic_ep": elastic},
    }
    for values in itertools.product((False, True), (False, True), (False, True, None), (False, True))
    for tp, dp, elastic in itertools.product((1, 2), (1, 4), (False, True))
]


def engram_side(case: dict[str, Any]) -> dict[str, Any]:
    try:
        config = EngramConfig(**case["engram"])
    except ConfigError as exc:
        return {"constructed": False, "error": exc.errors[0].message}
    parallel = ParallelConfig(**case["parallel"])
    unresolved = config.compute_hash()
    config = config.resolve_dp_shared_memory(parallel)
    out: dict[str, Any] = {
        "constructed": True,
        "unresolved_hash": unresolved,
        "dp_shared_memory": config.dp_shared_memory,
        "hash": config.compute_hash(),
        "parallel_size": config.get_parallel_size(parallel),
    }
    try:
        config.verify_parallel_config(parallel)
        out["parallel_error"] = None
    except ConfigError as exc:
        out["parallel_error"] = exc.errors[0].message
    return out


def test_every_setting_agrees_with_vllm() -> None:
    theirs = ask_vllm("config", CASES)
    assert len(theirs) == len(CASES) == 192
    differ = [
        (case, engram_side(case), vllm) for case, vllm in zip(CASES, theirs, strict=True) if engram_side(case) != vllm
    ]
    assert differ == []
    assert sum(v["constructed"] for v in theirs) == 112  # 14 of the 24 field settings pass the rules
    assert {v["dp_shared_memory"] for v in theirs if v["constructed"]} == {False, True}
    assert len({v.get("parallel_error") for v in theirs if v["constructed"]}) == 4
