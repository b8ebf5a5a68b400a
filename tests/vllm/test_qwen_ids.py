"""Qwen4Exp row ids against vLLM 0.33.0's own Qwen4ExpNGramEmbedding (its CPU path, its layout and
multiplier code; tests/vllm/runner.py): three PLE layers given out of order, so each layer's table, dense
id and multipliers are exercised; several requests with EOS inside, chunked prefill at uneven cuts and
single-token decode steps, every request's context carried between steps exactly as vLLM's model state
fills it (the last N-1 computed tokens, EOS before the first)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from engram.ngram.hash import HashState
from engram.ngram.spec import ModelSpec
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm
EOS = 7


def hf_config(ngram: int) -> dict[str, Any]:
    return {
        "ple_layer_ids": [6, 1, 3],
        "ngram_size": ngram,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 1_000,
        "ple_embed_dim": 2 * (ngram - 1) * 8,
        "vocab_size": 500,
        "make_ngram_vocab_size_divisible_by": 16,
        "seed": 77,
        "eos_token_id": EOS,
    }


def steps(rng: random.Random) -> list[list[list[int]]]:
    """Per step, each live request's new tokens: a prompt cut into uneven chunks, then decode tokens."""
    requests = []
    for _ in range(4):
        prompt = [rng.choice([EOS, *range(8, 40)]) for _ in range(rng.randint(1, 30))]
        cuts = sorted(rng.sample(range(1, len(prompt)), min(2, len(prompt) - 1))) if len(prompt) > 1 else []
        chunks = [prompt[a:b] for a, b in zip([0, *cuts], [*cuts, len(prompt)], strict=True)]
        chunks += [[rng.choice([EOS, 9, 10, 11])] for _ in range(rng.randint(1, 4))]
        requests.append(chunks)
    return [[r[s] for r in requests if s < len(r)] for s in range(max(map(len, requests)))]


def cases(ngram: int, seed: int) -> list[dict[str, Any]]:
    """One vLLM batch per step; requests keep their slot (all start together, finish at different steps)."""
    out = []
    seen: list[list[int]] = [[] for _ in range(4)]
    for batch in steps(random.Random(seed)):
        context = [([EOS] * (ngram - 1) + seen[r])[-(ngram - 1) :] for r in range(len(batch))]
        starts = [0]
        for tokens in batch:
            starts.append(starts[-1] + len(tokens))
        out.append(
            {
                "hf": hf_config(ngram),
                "input_ids": [t for tokens in batch for t in tokens],
                "query_start_loc": starts,
                "ngram_context": context,
                "requests": batch,
            }
        )
        for r, tokens in enumerate(batch):
            seen[r] += tokens
    return out


def engram_ids(all_cases: list[dict[str, Any]]) -> list[list[list[list[int]]]]:
    """The same steps through engram's hasher, one HashState per request carried across steps."""
    spec = ModelSpec("qwen", "Qwen4ExpForCausalLM", all_cases[0]["hf"], dtype="bf16")
    hasher = spec.hasher()
    states: list[HashState | None] = [None] * 4
    answers = []
    for case in all_cases:
        rows = []
        for r, tokens in enumerate(case["requests"]):
            ids, states[r] = hasher.hash_with_state(torch.tensor(tokens), state=states[r])
            rows.append(ids)
        step = torch.cat(rows)  # [T, layers, C]
        answers.append([step[:, layer].tolist() for layer in range(step.shape[1])])
    return answers


@pytest.mark.parametrize("ngram", [2, 3, 4])
def test_qwen_ids_equal_vllm(ngram: int) -> None:
    all_cases = [c for seed in range(5) for c in cases(ngram, seed)]
    theirs = ask_vllm("qwen_ids", [{k: v for k, v in c.items() if k != "requests"} for c in all_cases])
    ours = []
    for seed in range(5):
        ours += engram_ids(cases(ngram, seed))
    assert len(ours) == len(theirs) > 20
    assert [t["ids"] for t in theirs] == ours
    assert any(EOS in c["input_ids"] for c in all_cases)
