"""Per-rank layouts against vLLM 0.33.0's own code (tests/vllm/runner.py). DeepSeek V4.1: for TP 1/2/4 x
DP 1/2/4/8 on nodes of 1, 2 or all replicas, host and GPU tables, embedding_across_dp on and off, shared
or not, every rank's table slice (first row, rows, first head) equals what vLLM's ParallelEngramEmbedding
takes, and where vLLM refuses the layout, engram's plan names the same reason. Qwen4Exp: for TP 1/2/4 x
DP 1/2/4, every rank's ETP group and table rows equal those of vLLM's initialize_model_parallel and
Qwen4ExpNGramEmbedding, whatever dp_shared_memory (null, false, true) and file_backed say."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import torch

from engram.config import ParallelConfig, load_config
from engram.errors import ConfigError
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import hf_config, write_checkpoint
from engram.runtime.plan import plan_deployment
from engram.runtime.rank_tables import open_tables
from tests.runtime.specs import QWEN
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm
HF = {
    "engram_layer_ids": [1, 3],
    "engram_max_ngram_size": 3,
    "engram_n_heads": 4,
    "engram_head_dim": 64,
    "engram_vocab_size": 1_000,
    "engram_compressed_vocab_size": 500,
    "engram_pad_token_id": 2,
}
SPEC = ModelSpec("layout", "DeepseekV41ForCausalLM", HF, dtype="fp8")


def cases() -> list[dict[str, Any]]:
    out = []
    for tp, dp, cpu_offload, across, shared in itertools.product((1, 2, 4), (1, 2, 4, 8), *[(False, True)] * 3):
        for local in sorted({1, min(2, dp), dp}):
            fields = {"cpu_offload": cpu_offload, "embedding_across_dp": across, "dp_shared_memory": shared}
            parallel = {"tensor_parallel_size": tp, "data_parallel_size": dp, "data_parallel_size_local": local}
            try:
                load_config(fields, env={}).verify_parallel_config(ParallelConfig(**parallel))
            except ConfigError:
                continue
            hf = {**HF, "engram_num_embeddings": list(SPEC.layout.table_rows)}
            out.append({"tp": tp, "dp": dp, "local": local, **fields, "hf": hf, "fields": fields, "parallel": parallel})
    return out


def engram_side(case: dict[str, Any]) -> dict[str, Any]:
    plan = plan_deployment(SPEC, load_config(case["fields"], env={}), ParallelConfig(**case["parallel"]))
    if plan.vllm_refusal:
        return {"refused": plan.vllm_refusal}
    ranks = []
    for rank in plan.ranks:
        tables = []
        for table in rank.tables:
            peer = table.kind == "row"
            tables.append(
                {
                    "row_start": table.row_start,
                    "rows": table.rows,
                    "head_start": 0 if peer else table.head_start,
                    "heads": SPEC.layout.columns if peer else -(-SPEC.layout.columns // plan.group_size),
                    "peer_rows": -(-table.table_rows // plan.group_size) if peer else 0,
                }
            )
        ranks.append(tables)
    return {"ranks": ranks}


def test_deepseek_layouts_equal_vllm() -> None:
    all_cases = cases()
    theirs = ask_vllm(
        "deepseek_layout", [{k: v for k, v in c.items() if k not in ("fields", "parallel")} for c in all_cases]
    )
    compared = refused = 0
    for case, vllm in zip(all_cases, theirs, strict=True):
        if "error" in vllm:  # vLLM's model rejects it (dp_shared_memory with one replica per node)
            assert case["dp_shared_memory"] and case["local"] == 1, (case, vllm)
            continue
        ours = engram_side(case)
        assert ours == {k: v for k, v in vllm.items() if k != "edp"}, (case, vllm["edp"])
        compared += 1
        refused += "refused" in vllm
    assert (len(all_cases), compared, refused) == (156, 138, 12)


def test_deepseek_checkpoints_load_through_vllms_weight_loaders(tmp_path: Path) -> None:
    """A checkpoint `engram make-checkpoint` writes, loaded by every rank's ParallelEngramEmbedding through
    its own weight loaders (TP 2 x DP 2 on one node: heads over TP x EDP 4), equals engram's shards byte
    for byte."""
    write_checkpoint(SPEC, tmp_path, seed=6)
    fields = {"cpu_offload": False, "embedding_across_dp": False, "dp_shared_memory": False}
    parallel = {"tensor_parallel_size": 2, "data_parallel_size": 2, "data_parallel_size_local": 2}
    hf = {**HF, "engram_num_embeddings": list(SPEC.layout.table_rows)}
    [theirs] = ask_vllm("deepseek_layout", [{"tp": 2, "dp": 2, "local": 2, **fields, "hf": hf, "path": str(tmp_path)}])
    plan = plan_deployment(SPEC, load_config(fields, env={}), ParallelConfig(**parallel), "cpu")
    assert theirs["edp"] == 2 and len(theirs["ranks"]) == 4
    for rank, vllm in zip(plan.ranks, theirs["ranks"], strict=True):
        shards = open_tables(SPEC, Checkpoint(tmp_path), "host", plans=rank.tables, progress=False)
        for shard, table in zip(shards, vllm, strict=True):
            assert table["row_start"] == shard.row_start and table["rows"] == shard.rows
            assert table["weight"] == shard.weight.view(torch.uint8).flatten().tolist()
            assert table["scale"] == shard.scale.view(torch.uint8).flatten().tolist()


def qwen_cases() -> list[dict[str, Any]]:
    """vLLM's config fields over TP x DP, with engram's file_backed beside the host-table cases it may take
    (vLLM has no such field: the rows must be those of the same config without it)."""
    out = []
    for tp, dp, cpu_offload, across, shared, thp in itertools.product(
        (1, 2, 4), (1, 2, 4), (False, True), (False, True), (None, False, True), (False, True)
    ):
        fields = {"cpu_offload": cpu_offload, "embedding_across_dp": across, "dp_shared_memory": shared, "use_thp": thp}
        parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)
        variants = [fields]
        if cpu_offload and not thp and not shared:
            variants.append({**fields, "dp_shared_memory": False, "file_backed": True})
        for ours in variants:
            try:
                load_config(ours, env={}).resolve_dp_shared_memory(parallel).verify_parallel_config(parallel)
            except ConfigError:
                continue
            out.append({"tp": tp, "dp": dp, "engram": fields, "ours": ours})
    return out


def test_qwen_layouts_equal_vllm() -> None:
    all_cases = qwen_cases()
    hf = hf_config(QWEN, "bf16", 0)
    theirs = ask_vllm(
        "qwen_layout", [{"tp": c["tp"], "dp": c["dp"], "engram": c["engram"], "hf": hf} for c in all_cases]
    )
    spread = 0
    for case, vllm in zip(all_cases, theirs, strict=True):
        parallel = ParallelConfig(tensor_parallel_size=case["tp"], data_parallel_size=case["dp"])
        plan = plan_deployment(QWEN, load_config(case["ours"], env={}), parallel)
        ours = [
            {"group": list(r.embedding_group), "tables": [[t.row_start, t.row_stop] for t in r.tables]}
            for r in plan.ranks
        ]
        assert ours == vllm["ranks"], case
        if vllm["etp"] > case["tp"] and plan.config.dp_shared_memory:  # ETP over DP with sharing on: nothing shared
            assert plan.sharing_note is not None and all(r.shm_group is None for r in plan.ranks), case
            spread += 1
    assert (len(all_cases), spread) == (156, 12)
