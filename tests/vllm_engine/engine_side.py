"""Run by the vLLM CPU build's Python (tests/vllm_engine/runner.py), never imported by engram's tests: makes
the tiny Qwen4Exp model with transformers' own implementation, or runs vLLM's engine on it (LLM.generate)
and prints, as one JSON line, every prompt's greedy tokens and each step's raw logits (vLLM's
logprobs_mode "raw_logits", every token's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def make_model(case: dict[str, Any]) -> dict[str, Any]:
    """A Qwen4ExpForCausalLM of case["config"] with seeded random weights, saved as transformers saves it:
    each PLE table in split_ngram_parts `shard_<k>` parts (Qwen4Exp's real layout); with case["whole"], the
    parts of each written back as one tensor. Answers the tables and the parts of each."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import Qwen4ExpForCausalLM, Qwen4ExpTextConfig

    out = Path(case["path"])
    config = Qwen4ExpTextConfig(**case["config"])
    config.architectures = ["Qwen4ExpForCausalLM"]
    torch.manual_seed(case.get("seed", 0))
    Qwen4ExpForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    [path] = sorted(out.glob("*.safetensors"))
    tensors = load_file(str(path))
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for name in list(tensors):
        stem, found, rest = name.partition(".ngram_embedding.shard_")
        if found:
            number, _, suffix = rest.partition(".")
            parts.setdefault(f"{stem}.ngram_embedding|{suffix}", {})[int(number)] = tensors[name]
    if case.get("whole"):
        for key, pieces in parts.items():
            table, suffix = key.split("|")
            for k in pieces:
                del tensors[f"{table}.shard_{k}.{suffix}"]
            tensors[f"{table}.{suffix}"] = torch.cat([pieces[k] for k in sorted(pieces)])
        save_file(tensors, str(path), metadata={"format": "pt"})
    return {
        "tables": {key.split("|")[0]: len(pieces) for key, pieces in parts.items()},
        "whole": bool(case.get("whole")),
    }


def generate(case: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine on the model: each prompt's greedy tokens and every step's raw logits."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=case["path"],
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=case.get("max_model_len", 128),
        max_num_seqs=4,
        enforce_eager=True,
        max_logprobs=-1,
        logprobs_mode="raw_logits",
        engram_config=case["engram_config"],
        additional_config=case.get("additional_config") or {},
        seed=0,
    )
    params = SamplingParams(max_tokens=case["max_tokens"], temperature=0, logprobs=case["vocab"])
    outputs = llm.generate([{"prompt_token_ids": p} for p in case["prompts"]], params)
    answer = []
    for output in outputs:
        completion = output.outputs[0]
        steps = [[step[token].logprob for token in sorted(step)] for step in completion.logprobs]
        answer.append({"tokens": list(completion.token_ids), "logits": steps})
    return {"outputs": answer}


KINDS = {"make_model": make_model, "generate": generate}

if __name__ == "__main__":
    case = json.loads(sys.argv[1])
    result = KINDS[case["kind"]](case)
    print("ENGRAM-RESULT " + json.dumps(result), flush=True)
