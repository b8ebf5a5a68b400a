"""engram's EngramConfig against the real vLLM package (tests/vllm/runner.py; 0.33.0 and 0.34.0): for every
setting of that version's fields (dp_shared_memory true, false or null; 0.34's disk_offload), at TP 1/2 x
DP 1/4 with and without elastic EP, the same constructor verdict and message, the same digest (that
version's: 0.33's compute_hash, 0.34's compile_factors) before and after dp_shared_memory is resolved, the
same resolution, the same verify_parallel_config verdict and message, the same embedding group size, and on
0.34 the same compile_factors()."""

from __future__ import annotations

import itertools
from typing import Any

from engram.config import EngramConfig, ParallelConfig
from engram.errors import ConfigError
from tests.config.fields import VLLM_VERSIONS
from tests.vllm.runner import ask_vllm, needs_vllm, vllm_version

pytestmark = needs_vllm


def cases() -> list[dict[str, Any]]:
    """Every setting of the fields the vLLM under test has, at each parallel shape."""
    fields = VLLM_VERSIONS["{}.{}".format(*vllm_version())]
    choices = [(False, True, None) if name == "dp_shared_memory" else (False, True) for name in fields]
    return [
        {
            "engram": dict(zip(fields, values, strict=True)),
            "parallel": {"tensor_parallel_size": tp, "data_parallel_size": dp, "enable_elastic_ep": elastic},
        }
        for values in itertools.product(*choices)
        for tp, dp, elastic in itertools.product((1, 2), (1, 4), (False, True))
    ]


def engram_side(case: dict[str, Any]) -> dict[str, Any]:
    version = "{}.{}".format(*vllm_version())
    try:
        config = EngramConfig(**case["engram"])
    except ConfigError as exc:
        return {"constructed": False, "error": exc.errors[0].message}
    parallel = ParallelConfig(**case["parallel"])
    unresolved = config.compute_hash(vllm=version)
    config = config.resolve_dp_shared_memory(parallel)
    out: dict[str, Any] = {
        "constructed": True,
        "unresolved_hash": unresolved,
        "dp_shared_memory": config.dp_shared_memory,
        "hash": config.compute_hash(vllm=version),
        "compile_factors": config.compile_factors() if vllm_version() >= (0, 34) else None,  # 0.34's API
        "parallel_size": config.get_parallel_size(parallel),
    }
    try:
        config.verify_parallel_config(parallel)
        out["parallel_error"] = None
    except ConfigError as exc:
        out["parallel_error"] = exc.errors[0].message
    return out


def test_every_setting_agrees_with_vllm() -> None:
    every = cases()
    theirs = ask_vllm("config", every)
    newer = vllm_version() >= (0, 34)
    assert len(theirs) == len(every) == (384 if newer else 192)
    differ = [
        (case, engram_side(case), vllm) for case, vllm in zip(every, theirs, strict=True) if engram_side(case) != vllm
    ]
    assert differ == []
    # 14 of the 24 settings of 0.33's four fields pass the rules, each with disk_offload either way on 0.34
    assert sum(v["constructed"] for v in theirs) == (224 if newer else 112)
    assert {v["dp_shared_memory"] for v in theirs if v["constructed"]} == {False, True}
    # 0.34 adds "disk_offload is not supported with elastic EP."
    assert len({v.get("parallel_error") for v in theirs if v["constructed"]}) == (5 if newer else 4)
