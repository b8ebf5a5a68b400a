"""Run inside the SGLang venv (never imported by engram's tests): reads cases as JSON lines on stdin, each
naming its `kind`, and answers each with what SGLang's own classes and engram's plugin classes give on the
same inputs, as JSON lines on stdout. SGLang runs on the CPU: its Triton kernels under the interpreter,
its rank and server settings stated with its own runtime_context overrides."""

import contextlib
import hashlib
import json
import logging
import os
import sys
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch
from safetensors.torch import load_file
from sglang.srt.layers import engram as theirs
from sglang.srt.runtime_context import get_context, get_parallel

from engram.apps.presets import get_preset
from engram.integrations import model_tables
from engram.integrations.sglang.deepseek import embedding_class
from engram.integrations.sglang.rules import ENV


def digest(rows: torch.Tensor) -> str:
    return hashlib.sha256(rows.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def ranks(tp: int, rank: int) -> Any:
    """SGLang's parallel context for TP rank `rank` of `tp` (no DP attention, no context parallelism)."""
    return get_parallel().override(
        tp_size=tp, tp_rank=rank, attn_tp_size=tp, attn_dp_size=1, attn_cp_size=1,
        moe_tp_size=tp, moe_ep_size=1, moe_dp_size=1,
    )  # fmt: skip


def built(cls: type, layer: int, preset: str) -> Any:
    """Layer `layer`'s table of `preset`, as SGLang's Engram module builds it, of class `cls` (SGLang's or
    engram's)."""
    spec = get_preset(preset)
    primes = spec.layout.primes.reshape(len(spec.layout.layer_ids), -1)[layer]
    bounds = (0, *torch.tensor(primes.astype("int64")).cumsum(0).tolist())
    return cls(spec.layout.table_rows[layer], spec.head_dim, spec.layout.layer_ids[layer], column_bounds=bounds)


def loaded(cls: type, layer: int, tensors: dict[str, torch.Tensor], case: dict[str, Any]) -> Any:
    """built(), its weights given through its own loaders whole, as SGLang's DeepSeek V4 load_weights gives
    them (a checkpoint split into shard_<k> parts: the parts joined), then finish_load."""
    table = built(cls, layer, case["preset"])
    layer_id = get_preset(case["preset"]).layout.layer_ids[layer]
    for part in ("weight", "scale"):
        parameter = getattr(table, part)
        head = f"layers.{layer_id}.engram.embed."
        whole = tensors.get(head + part)
        if whole is None:
            pieces = sorted((k for k in tensors if k.startswith(head + "shard_") and k.endswith("." + part)),
                            key=lambda k: int(k.removeprefix(head + "shard_").split(".")[0]))  # fmt: skip
            whole = torch.cat([tensors[k] for k in pieces])
        parameter.weight_loader(parameter, whole)
    table.finish_load(f"layer {layer_id}")
    return table


def rows_case(case: dict[str, Any]) -> dict[str, Any]:
    """For each rank of each TP size and each id batch: SGLang's owned rows and engram's, their digests,
    where engram keeps the table, and with TP 1 the forward's rows of both."""
    os.environ[ENV] = json.dumps(case["config"])
    ours = embedding_class(theirs.EngramEmbedding)
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(case["checkpoint"])):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(case["checkpoint"], name)))
    out: dict[str, Any] = {"ranks": []}
    with get_context().override_server_args(model_path=case["checkpoint"]):
        for tp in case["tp"]:
            for rank in range(tp):
                with ranks(tp, rank):
                    sglang_table = loaded(theirs.EngramEmbedding, case["layer"], tensors, case)
                    engram_table = loaded(ours, case["layer"], tensors, case)
                    seen: dict[str, Any] = {"tp": tp, "rank": rank, "row_start": engram_table.row_start,
                                            "rows": engram_table.rows, "placement": engram_table.engram.shard.placement,
                                            "tier": None if engram_table.engram.tier is None else engram_table.engram.tier.name,
                                            # SGLang's scheduler row stager copies from weight's memory: never engram's
                                            "staged_by_scheduler": bool(engram_table.shared_host_table_without_ats),
                                            "batches": []}  # fmt: skip
                    for ids in case["ids"]:
                        ids_t = torch.tensor(ids, dtype=torch.int64)
                        for _ in range(case.get("repeat", 1)):  # a tier's misses, then its hits
                            expected, got = sglang_table._owned_rows(ids_t), engram_table._owned_rows(ids_t)
                        batch = {
                            "sglang": digest(expected),
                            "engram": digest(got),
                            "equal": bool(torch.equal(expected.view(torch.int16), got.view(torch.int16))),
                        }
                        if tp == 1:
                            forward = engram_table(ids_t)
                            batch["forward_equal"] = bool(
                                torch.equal(sglang_table(ids_t).view(torch.int16), forward.view(torch.int16))
                            )
                        seen["batches"].append(batch)
                    out["ranks"].append(seen)
                    del sglang_table, engram_table
        model_tables.forget_checkpoints()
    return out


def plugin_case(case: dict[str, Any]) -> dict[str, Any]:
    """SGLang's own plugin loader run with engram's entry point installed (SGLANG_PLUGINS=engram): which class
    each module that holds the name now has, and whether the replaced class still builds SGLang's tables."""
    from sglang.srt.layers import engram_staging
    from sglang.srt.models import deepseek_v4
    from sglang.srt.plugins import load_plugins

    from engram.integrations.sglang import register

    load_plugins()
    register()  # again, as a second loader would: changes nothing
    from sglang.srt.models import qwen4_exp

    names = {
        "sglang.srt.layers.engram": theirs.EngramEmbedding,
        "sglang.srt.layers.engram_staging": getattr(engram_staging, "EngramEmbedding", None),
        "sglang.srt.models.deepseek_v4": getattr(deepseek_v4, "EngramEmbedding", None),
        "sglang.srt.models.qwen4_exp": qwen4_exp.Qwen4ExpPinnedHostEmbedding,
    }
    replaced = {module: None if cls is None else cls.__module__ for module, cls in names.items()}
    mro = [c.__module__ for c in theirs.EngramEmbedding.__mro__[:2]]
    init = qwen4_exp.Qwen4ExpNGramEmbedding.__init__
    return {
        "replaced": replaced,
        "mro": mro,
        "naming_hooked": init.__module__ != "sglang.srt.models.qwen4_exp" or hasattr(init, "__wrapped__"),
    }


def error_case(case: dict[str, Any]) -> dict[str, Any]:
    """The error a table build meets under these environment variables (None where it builds)."""
    saved = {name: os.environ.get(name) for name in case["env"]}
    os.environ.update({k: v for k, v in case["env"].items()})
    try:
        with ranks(1, 0), get_context().override_server_args(model_path=case.get("checkpoint", "dummy")):
            built(embedding_class(theirs.EngramEmbedding), 0, "tiny")
        return {"error": None}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def qwen_tables(case: dict[str, Any], tensors: dict[str, torch.Tensor], ours: bool) -> Any:
    """SGLang's Qwen4ExpPinnedHostEmbedding (or engram's, `ours`) for PLE table `case["table"]` at the ranks
    in effect, built as SGLang's Qwen4ExpNGramEmbedding builds it (a VocabParallelEmbedding on the meta
    device first, then the host table around it), its weight given through its own loader whole. Without a
    GPU SGLang's pinned host memory is plain host memory (pin_memory needs a driver): torch.empty's
    pin_memory is dropped while SGLang's builds."""
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from sglang.srt.models import qwen4_exp

    from engram.integrations.sglang.qwen import _BUILDING, pinned_host_class

    whole = tensors[case["table"] + ".weight"]
    with torch.device("meta"):
        source = VocabParallelEmbedding(
            whole.shape[0], whole.shape[1], params_dtype=whole.dtype, output_dtype=torch.bfloat16
        )
    source.register_buffer("weight_scale", torch.ones(1, dtype=torch.bfloat16), persistent=True)
    if ours:
        token = _BUILDING.set(case["prefix"])
        try:
            table = pinned_host_class(qwen4_exp.Qwen4ExpPinnedHostEmbedding)(source)
        finally:
            _BUILDING.reset(token)
    else:
        empty = torch.empty

        def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            return empty(*args, **kwargs)

        torch.empty = unpinned  # type: ignore[assignment]
        try:
            table = qwen4_exp.Qwen4ExpPinnedHostEmbedding(source)
        finally:
            torch.empty = empty
    table.weight.weight_loader(table.weight, whole)
    return table


def gathered(table: Any, ids: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """`table.gather` of `ids` into a prefetch buffer (as SGLang's start_prefetch gives one, filled with
    sevens first), and whether the rows came back in it."""
    buffer = torch.full((*ids.shape, table.embedding_dim), 7.0, dtype=torch.bfloat16)
    rows = table.gather(ids, out=buffer)
    return rows, rows is buffer


def qwen_rows_case(case: dict[str, Any]) -> dict[str, Any]:
    """For each config, each rank of each TP size and each id batch: engram's gathered rows against
    SGLang's (gathered once per rank: its table does not depend on engram's config), their digests, and
    where engram keeps the table. A config that gives a tier looks each batch up twice (misses, then hits)."""
    tensors: dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(case["checkpoint"])):
        if name.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(case["checkpoint"], name)))
    batches = [torch.tensor(ids, dtype=torch.int64) for ids in case["ids"]]
    out: dict[str, Any] = {"configs": [{"ranks": []} for _ in case["configs"]]}
    os.environ.pop(ENV, None)
    with get_context().override_server_args(model_path=case["checkpoint"]):
        for tp in case["tp"]:
            for rank in range(tp):
                with ranks(tp, rank):
                    sglang_table = qwen_tables(case, tensors, ours=False)
                    expected = [gathered(sglang_table, ids)[0] for ids in batches]
                    del sglang_table
                    for config, answer in zip(case["configs"], out["configs"], strict=True):
                        os.environ[ENV] = json.dumps(config)
                        engram_table = qwen_tables(case, tensors, ours=True)
                        shard = engram_table.shard_indices
                        seen: dict[str, Any] = {
                            "tp": tp, "rank": rank, "start": shard.org_vocab_start_index,
                            "stop": shard.org_vocab_end_index, "placement": engram_table.engram.shard.placement,
                            "batches": [],
                        }  # fmt: skip
                        for ids, rows in zip(batches, expected, strict=True):
                            for _ in range(
                                2 if config.get("ram_cache_bytes") or config.get("device_cache_bytes") else 1
                            ):
                                got, into_buffer = gathered(engram_table, ids)
                            tier = engram_table.engram.tier
                            seen["batches"].append({
                                "sglang": digest(rows), "engram": digest(got), "into_buffer": into_buffer,
                                "equal": bool(torch.equal(rows.view(torch.int16), got.view(torch.int16))),
                                "tier": None if tier is None else tier.name,
                            })  # fmt: skip
                        answer["ranks"].append(seen)
                        del engram_table
                        os.environ.pop(ENV, None)
        model_tables.forget_checkpoints()
    return out


KINDS = {"rows": rows_case, "qwen rows": qwen_rows_case, "plugin": plugin_case, "error": error_case}


def main() -> None:
    logging.getLogger("engram").setLevel(logging.ERROR)
    for line in sys.stdin:
        case = json.loads(line)
        with contextlib.redirect_stdout(sys.stderr):  # SGLang's prints stay out of the answers
            answer = KINDS[case["kind"]](case)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
