"""Qwen4Exp checkpoints that `engram make-checkpoint` writes, loaded by vLLM 0.33.0's own
Qwen4ExpNGramEmbedding (its load_weights: shard_{k} parts, hash buffers, table scales, and its parameters'
weight loaders; tests/vllm/runner.py), whole or split, bf16, fp8-table and nvfp4, as each of two ETP
ranks: every parameter vLLM ends with equals, byte for byte, the shard engram loads for the same rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import vllm_refusals, write_checkpoint
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables
from tests.runtime.specs import QWEN
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm


def as_sent(tensor: torch.Tensor) -> list:  # type: ignore[type-arg]
    """A parameter as vllm_side.py answers it: float32 as values, anything else as its bytes."""
    return tensor.tolist() if tensor.dtype == torch.float32 else tensor.contiguous().view(torch.uint8).tolist()


@pytest.mark.parametrize("dtype", ["bf16", "fp8-table", "nvfp4"])
@pytest.mark.parametrize("split", [None, 7])
def test_vllm_loads_what_make_checkpoint_writes(dtype: str, split: int | None, tmp_path: Path) -> None:
    spec = dataclasses.replace(QWEN, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=3, split_parts=split)
    theirs = ask_vllm("qwen_load", [{"path": str(tmp_path), "etp": 2, "etp_rank": r} for r in (0, 1)])
    if dtype == "nvfp4" and split is None:  # vLLM takes NVFP4 tables only in parts, and engram says so
        assert theirs[0]["error"].startswith("NVFP4 PLE tables must be stored as ngram_embedding.shard_<i>.weight")
        assert vllm_refusals(spec, dtype, None) == [
            "its Qwen4Exp NVFP4 tables load only as shard_<k> parts: pass --split-parts"
        ]
        return
    f = spec.layout
    for rank, answer in enumerate(theirs):
        assert "error" not in answer, answer
        shards = open_tables(spec, Checkpoint(tmp_path), "host", plans=table_shards(spec, rank, 2), progress=False)
        for layer_id, shard in zip(f.layer_ids, shards, strict=True):
            vllm = answer[str(layer_id)]
            assert vllm["row_start"] == shard.row_start
            assert {"layer_multipliers", "ngram_heads_offsets", "ngram_heads_vocab_sizes"} <= set(vllm["loaded"])
            fmt = shard.format.row_format
            ours = {"weight": shard.weight}
            if shard.scale is not None:
                ours[fmt.scale_name] = shard.scale
            if shard.table_scale is not None:
                ours[fmt.table_scale_name] = shard.table_scale
            assert set(vllm["params"]) == set(ours)
            for name, tensor in ours.items():
                assert vllm["params"][name] == as_sent(tensor), (layer_id, name)
