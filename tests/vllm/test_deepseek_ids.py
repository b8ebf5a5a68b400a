"""DeepSeek V4.1 row ids against vLLM 0.33.0's own hash kernel (NgramHashState.forward, its Triton kernel
under the interpreter; tests/vllm/runner.py): two layers, four requests with dead spans (image
placeholders) inside and across chunk boundaries, chunked prefill at uneven cuts, then decode steps; each
step's lookback window filled as vLLM's V2 runner fills it (the ids just before the chunk, newest first,
with their dead flags), engram's HashState carried per request."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engram.ngram.hash import HashState
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.writer import hf_config
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm
PAD = 2


def hf(ngram: int) -> dict[str, Any]:
    return {
        "engram_layer_ids": [1, 3],
        "engram_max_ngram_size": ngram,
        "engram_n_heads": 3,
        "engram_head_dim": 64,
        "engram_vocab_size": 700,
        "engram_compressed_vocab_size": 300,
        "engram_pad_token_id": PAD,
    }


def requests(rng: random.Random) -> list[list[tuple[list[int], list[bool]]]]:
    """Per request, its chunks of (compressed ids, dead flags): a prompt with a dead span, cut unevenly,
    then single decode tokens."""
    out = []
    for _ in range(4):
        length = rng.randint(1, 24)
        ids = [rng.randrange(300) for _ in range(length)]
        dead = [False] * length
        if length > 3:
            start = rng.randrange(length - 2)
            for i in range(start, min(length, start + rng.randint(1, 5))):
                dead[i] = True
        cuts = sorted(rng.sample(range(1, length), min(2, length - 1))) if length > 1 else []
        bounds = list(zip([0, *cuts], [*cuts, length], strict=True))
        chunks = [(ids[a:b], dead[a:b]) for a, b in bounds]
        chunks += [([rng.randrange(300)], [False]) for _ in range(rng.randint(1, 3))]
        out.append(chunks)
    return out


def steps(ngram: int, seed: int) -> list[dict[str, Any]]:
    chunks = requests(random.Random(seed))
    seen: list[tuple[list[int], list[bool]]] = [([], []) for _ in chunks]
    out = []
    for step in range(max(map(len, chunks))):
        live = [r for r in range(len(chunks)) if step < len(chunks[r])]
        text = hf_config(ModelSpec("ds", "DeepseekV41ForCausalLM", hf(ngram)), "fp8", 0)["text_config"]
        case: dict[str, Any] = {"hf": text, "input_ids": [], "positions": [], "dead": [], "query_start_loc": [0]}
        case |= {"lookback_ids": [], "lookback_dead": [], "requests": []}
        for r in live:
            ids, dead = chunks[r][step]
            done_ids, done_dead = seen[r]
            case["input_ids"] += ids
            case["dead"] += dead
            case["positions"] += list(range(len(done_ids), len(done_ids) + len(ids)))
            case["query_start_loc"].append(len(case["input_ids"]))
            window = [(done_ids[-k], done_dead[-k]) if k <= len(done_ids) else (-1, False) for k in range(1, ngram)]
            case["lookback_ids"].append([w[0] for w in window])
            case["lookback_dead"].append([w[1] for w in window])
            case["requests"].append((r, ids, dead))
            seen[r] = (done_ids + ids, done_dead + dead)
        out.append(case)
    return out


def engram_ids(cases: list[dict[str, Any]]) -> list[list[list[list[int]]]]:
    spec = ModelSpec("ds", "DeepseekV41ForCausalLM", hf(cases[0]["hf"]["engram_max_ngram_size"]), dtype="fp8")
    hasher = spec.hasher()
    states: dict[int, HashState] = {}
    answers = []
    for case in cases:
        rows = []
        for r, ids, dead in case["requests"]:
            out, states[r] = hasher.hash_with_state(torch.tensor(ids), torch.tensor(dead), states.get(r))
            rows.append(out)
        answers.append(torch.cat(rows).tolist())
    return answers


@pytest.mark.parametrize("ngram", [2, 3, 4])
def test_deepseek_ids_equal_vllm(ngram: int) -> None:
    per_seed = [steps(ngram, seed) for seed in range(4)]
    cases = [c for seed_cases in per_seed for c in seed_cases]
    theirs = ask_vllm("deepseek_ids", [{k: v for k, v in c.items() if k != "requests"} for c in cases])
    ours = [step for seed_cases in per_seed for step in engram_ids(seed_cases)]
    assert [t["ids"] for t in theirs] == ours
    assert len(cases) > 12 and any(any(c["dead"]) for c in cases)
