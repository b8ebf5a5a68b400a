"""Run inside a vLLM venv (0.33 or 0.34; never imported by engram's tests): reads cases as JSON lines on
stdin, each naming its `kind`, and answers each with what vLLM's own code says, as JSON lines on stdout."""

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

# Where vLLM runs: "cpu" (its code on the CPU, its Triton kernels under the interpreter), or "cuda" on a GPU
# machine with vLLM installed, where the plugin cases run through vLLM's CUDA path (scripts/gpu_check.py).
DEVICE = os.environ.get("ENGRAM_VLLM_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
    # vLLM disables Triton where no GPU driver is active, except in a distributed worker whose visible
    # devices are empty (drivers come later): that branch keeps Triton, and the interpreter needs no driver.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402 (after the environment above)
from vllm.config.engram import EngramConfig  # noqa: E402 (after the environment above)
from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpNGramEmbedding  # noqa: E402 (after the environment above)


def reason(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)  # pydantic's ValidationError wraps the validator's ValueError
    return str(errors()[0]["ctx"]["error"]) if callable(errors) else str(exc)


def digest(config: Any) -> str:
    """vLLM's digest of its EngramConfig: compute_hash() until 0.33; from 0.34, the digest of
    compile_factors(), which VllmConfig.compile_factors() nests under "engram"."""
    if hasattr(config, "compile_factors"):
        from vllm.config.utils import hash_factors

        return hash_factors(config.compile_factors())
    return config.compute_hash()


def version_case(case: dict) -> dict:
    import vllm

    return {"version": vllm.__version__}


def config_case(case: dict) -> dict:
    try:
        config = EngramConfig(**case["engram"])
    except ValueError as exc:
        return {"constructed": False, "error": reason(exc)}
    parallel = SimpleNamespace(**case["parallel"])
    unresolved = digest(config)
    config.resolve_dp_shared_memory(parallel)  # as VllmConfig does, before the parallel checks
    out = {
        "constructed": True,
        "unresolved_hash": unresolved,
        "dp_shared_memory": config.dp_shared_memory,
        "hash": digest(config),
        "compile_factors": config.compile_factors() if hasattr(config, "compile_factors") else None,
        "parallel_size": config.get_parallel_size(parallel),
    }
    try:
        config.verify_parallel_config(parallel)
        out["parallel_error"] = None
    except ValueError as exc:
        out["parallel_error"] = reason(exc)
    return out


def qwen_module(hf: dict, layer_id: int) -> SimpleNamespace:
    """What Qwen4ExpNGramEmbedding.__init__ derives for the PLE layer on `layers.{layer_id - 1}` (the dense
    id is its rank among the sorted ple_layer_ids, as Qwen4ExpDecoderLayer computes it), without the
    table (which needs vLLM's parallel groups)."""
    cls = Qwen4ExpNGramEmbedding
    dense = sorted(set(hf["ple_layer_ids"])).index(layer_id)
    n, k = hf["ngram_size"], hf["heads_per_ngram"]
    multipliers = cls._make_layer_multipliers(
        ngram_size=n, unigram_vocab_size=hf["vocab_size"], seed=hf.get("seed", 1234), ple_dense_layer_id=dense
    )
    sizes, offsets, total = cls._make_vocab_layout(
        ngram_vocab_size_base=hf["ngram_vocab_size_base"], ngram_heads=(n - 1) * k, ple_dense_layer_id=dense
    )
    return SimpleNamespace(
        ngram_size=n,
        heads_per_ngram=k,
        eos_token_id=hf["eos_token_id"],
        layer_multipliers=torch.tensor(multipliers),
        ngram_heads_vocab_sizes=torch.tensor(sizes),
        ngram_heads_offsets=torch.tensor(offsets),
        _shift_precompute=cls._shift_precompute,
        _shift_apply=cls._shift_apply,
        rows=total,
    )


def qwen_ids_case(case: dict) -> dict:
    """Row ids per PLE layer (in ple_layer_ids order) for one batch step of vLLM's CPU path."""
    hf = case["hf"]
    out = []
    for layer_id in hf["ple_layer_ids"]:
        module = qwen_module(hf, layer_id)
        ids = Qwen4ExpNGramEmbedding.compute_ngram_ids(
            module,
            torch.tensor(case["input_ids"]),
            torch.tensor(case["query_start_loc"]),
            torch.tensor(case["ngram_context"]),
        )
        out.append(ids.tolist())
    return {"ids": out}


def checkpoint_config_case(case: dict) -> dict:
    """What vLLM's config registry and layout code make of a checkpoint directory's config.json."""
    from vllm.models.deepseek_v41.common.engram import EngramLayout
    from vllm.transformers_utils.config import get_config

    config = get_config(case["path"], trust_remote_code=False)
    out = {"class": type(config).__name__, "architectures": config.architectures}
    if out["class"] == "DeepseekV41Config":
        layout = EngramLayout.from_config(config)
        out["primes"] = [[list(order) for order in layer] for layer in layout.primes]
        out["offsets"] = layout.offsets.tolist()
        out["table_rows"] = list(layout.num_embeddings)
        return out
    hf = {
        name: getattr(config, name)
        for name in ("ple_layer_ids", "ngram_size", "heads_per_ngram", "ngram_vocab_size_base", "vocab_size")
    }
    hf["seed"] = config.seed
    hf["eos_token_id"] = config.eos_token_id
    divisor = config.make_ngram_vocab_size_divisible_by
    modules = [qwen_module(hf, layer_id) for layer_id in hf["ple_layer_ids"]]
    out["primes"] = [m.ngram_heads_vocab_sizes.tolist() for m in modules]
    out["offsets"] = [m.ngram_heads_offsets.tolist() for m in modules]
    out["multipliers"] = [m.layer_multipliers.tolist() for m in modules]
    out["table_rows"] = [-(-m.rows // divisor) * divisor for m in modules]
    out["head_dim"] = config.ple_embed_dim // ((config.ngram_size - 1) * config.heads_per_ngram)
    return out


def deepseek_layout_case(case: dict) -> dict:
    """Each rank's table slice as vLLM 0.33 builds it: the Engram DP group size from its own
    _engram_dp_shard_size (nodes of `local` consecutive replicas) and initialize_model_parallel's rule,
    then ParallelEngramEmbedding.__init__ on the meta device with the parallel state it reads patched in.
    A layout it refuses answers with its message."""
    from unittest import mock

    import vllm.distributed.parallel_state as state
    import vllm.models.deepseek_v41.common.engram as engram
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    tp, dp, local = case["tp"], case["dp"], case["local"]
    cpu_offload, across, shared = case["cpu_offload"], case["embedding_across_dp"], case["dp_shared_memory"]
    world = tp * dp

    def same_node(group, start):
        return [start <= r < start + local * tp for r in range(world)]

    if not cpu_offload and across and tp == 1:
        edp = dp
    else:
        with (
            mock.patch.object(state, "get_node_count", lambda: dp // local),
            mock.patch.object(state, "in_the_same_node_as", same_node),
            mock.patch.object(state, "get_world_group", lambda: SimpleNamespace(cpu_group=None)),
        ):
            edp = state._engram_dp_shard_size(world, dp, tp)
    layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
    out = {"edp": edp, "ranks": []}
    # With a checkpoint to load, real (CPU) tables; else the meta device, which allocates nothing.
    checkpoint = None
    if case.get("path"):
        from safetensors.torch import load_file

        checkpoint = load_file(f"{case['path']}/model.safetensors")
    torch.set_default_device("cpu" if checkpoint else "meta")
    for dp_rank in range(dp):
        for tp_rank in range(tp):
            group = SimpleNamespace(world_size=edp, rank_in_group=dp_rank % edp, cpu_group=None)
            patches = [
                mock.patch.object(engram, "get_engram_dp_size", lambda: edp),
                mock.patch.object(engram, "get_engram_dp_group", lambda group=group: group if edp > 1 else None),
                mock.patch.object(engram, "get_tensor_model_parallel_world_size", lambda: tp),
                mock.patch.object(engram, "get_tensor_model_parallel_rank", lambda tp_rank=tp_rank: tp_rank),
                mock.patch.object(engram, "is_uva_available", lambda: True),
                mock.patch.object(engram, "in_the_same_node_as", lambda g, source_rank=0: [True] * edp),
                mock.patch.object(
                    torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=1)
                ),
                mock.patch.object(torch.accelerator, "current_device_index", lambda: 0),
                mock.patch.object(
                    engram.current_platform, "visible_device_id_to_physical_device_id", lambda i: i, create=True
                ),
                mock.patch.object(engram.current_platform, "is_fully_connected", lambda ids: True, create=True),
                mock.patch.object(torch.distributed, "all_gather_object", lambda *a, **k: None),
            ]
            tables = []
            for patch in patches:
                patch.start()
            try:
                for index in range(len(layout.layer_ids)):
                    sizes = tuple(p for order in layout.primes[index] for p in order)
                    module = engram.ParallelEngramEmbedding(
                        layout.num_embeddings[index], layout.head_dim, sizes,
                        cpu_offload=cpu_offload, dp_shared_memory=shared,
                    )  # fmt: skip
                    table = {
                        "row_start": module.weight.engram_vocab_start,
                        "rows": module.part_num_embeddings,
                        "head_start": module.head_start,
                        "heads": module.part_n_hash_cols,
                        "peer_rows": module.peer_rows,
                    }
                    if checkpoint is not None:  # through the parameters' own weight loaders
                        name = f"layers.{layout.layer_ids[index]}.engram.embed"
                        module.weight.weight_loader(module.weight, checkpoint[f"{name}.weight"])
                        module.weight_scale_inv.weight_loader(module.weight_scale_inv, checkpoint[f"{name}.scale"])
                        table["weight"] = module.weight.data.view(torch.uint8).flatten().tolist()
                        table["scale"] = module.weight_scale_inv.data.view(torch.uint8).flatten().tolist()
                    tables.append(table)
            except AssertionError as exc:  # its own TODO: no row-wise sharding for too few heads
                return {"edp": edp, "refused": str(exc)}
            except ValueError as exc:  # e.g. dp_shared_memory with no co-located replicas
                return {"edp": edp, "error": str(exc)}
            finally:
                for patch in patches:
                    patch.stop()
            out["ranks"].append(tables)
    return out


def qwen_layout_case(case: dict) -> dict:
    """Each rank's Qwen4Exp PLE table rows as vLLM 0.33 lays them out: its EngramConfig, null
    dp_shared_memory resolved as VllmConfig does; the ETP groups initialize_model_parallel builds from its
    get_parallel_size (its own rank arithmetic, the process groups it would create recorded instead); and
    the row range Qwen4ExpNGramEmbedding's table takes at each rank's place in its group (meta device)."""
    from unittest import mock

    import vllm.distributed.parallel_state as state
    from transformers import Qwen4ExpTextConfig

    tp, dp = case["tp"], case["dp"]
    world = tp * dp
    engram_config = EngramConfig(**case["engram"])
    parallel = SimpleNamespace(
        tensor_parallel_size=tp, data_parallel_size=dp, enable_elastic_ep=False, use_all2all=False, enable_eplb=False
    )
    engram_config.resolve_dp_shared_memory(parallel)
    current = SimpleNamespace(
        parallel_config=parallel,
        engram_config=engram_config,
        model_config=SimpleNamespace(architecture="Qwen4ExpForCausalLM", is_moe=False),
    )
    groups: dict[str, list[list[int]]] = {}

    def record(group_ranks, local_rank, backend, *, group_name, **kwargs):
        groups[group_name] = group_ranks
        return SimpleNamespace(rank_in_group=0, world_size=len(group_ranks[0]), destroy=lambda: None)

    import vllm.config

    globals_ = ("_TP", "_ETP", "_ENGRAM_DP", "_DCP", "_PCP", "_PP", "_DP", "_EP", "_EPLB")
    with contextlib.ExitStack() as stack:
        for name in globals_:  # a fresh parallel state for this case, restored afterwards
            stack.enter_context(mock.patch.object(state, name, None))
        stack.enter_context(mock.patch.object(vllm.config, "get_current_vllm_config", lambda: current))
        stack.enter_context(mock.patch.object(state, "init_model_parallel_group", record))
        stack.enter_context(
            mock.patch.object(state, "get_world_group", lambda: SimpleNamespace(local_rank=0, device_group=None))
        )
        stack.enter_context(mock.patch.object(torch.distributed, "is_initialized", lambda: True))
        stack.enter_context(mock.patch.object(torch.distributed, "get_world_size", lambda group=None: world))
        stack.enter_context(mock.patch.object(torch.distributed, "get_rank", lambda group=None: 0))
        stack.enter_context(mock.patch.object(torch.distributed, "get_backend", lambda group=None: "gloo"))
        state.initialize_model_parallel(tensor_model_parallel_size=tp)
    etp_groups = groups.get("etp", groups["tp"])  # vLLM reuses the TP group where ETP = TP
    config = Qwen4ExpTextConfig(**case["hf"])
    torch.set_default_device("meta")
    ranks = []
    try:
        for rank in range(world):
            members = next(g for g in etp_groups if rank in g)
            with qwen_parallel_state(len(members), members.index(rank), SimpleNamespace(engram_config=None)):
                tables = []
                for layer_id in config.ple_layer_ids:
                    dense = sorted(set(config.ple_layer_ids)).index(layer_id)
                    module = Qwen4ExpNGramEmbedding(
                        config, config.ple_embed_dim, dense, 16, data_parallel_rank=rank // tp,
                        prefix=f"model.language_model.layers.{layer_id - 1}.ple.ple_embedding",
                        params_dtype=torch.bfloat16,
                    )  # fmt: skip
                    indices = module.ngram_embedding.shard_indices
                    tables.append([indices.org_vocab_start_index, indices.org_vocab_end_index])
            ranks.append({"group": members, "tables": tables})
    finally:
        torch.set_default_device("cpu")
    return {"etp": len(etp_groups[0]), "dp_shared_memory": engram_config.dp_shared_memory, "ranks": ranks}


def deepseek_ids_case(case: dict) -> dict:
    """Row ids of one batch step from vLLM's own NgramHashState.forward (its Triton hash kernel, V2 runner:
    lookback ids instead of 0.33's slot cache, which 0.34 dropped), with an identity token map: the ids
    given are compressed."""
    import vllm.models.deepseek_v41.common.engram as engram
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
    state = SimpleNamespace(
        layout=layout,
        use_slot_cache=False,
        _cache=None,
        block_size=64,
        token_map=torch.arange(layout.compressed_vocab_size, dtype=torch.int32),
        pad_id=layout.pad_token_id,
        primes=torch.tensor(layout.primes),
        offsets=layout.offsets,
        multipliers=engram.compute_hash_multipliers(
            layout.layer_ids, layout.max_ngram_size, layout.compressed_vocab_size
        ),
    )
    import inspect

    arguments = [
        state,
        torch.tensor(case["input_ids"], dtype=torch.int32),
        torch.tensor(case["positions"], dtype=torch.int64),
        torch.tensor(case["query_start_loc"], dtype=torch.int32),
        torch.tensor(case["dead"], dtype=torch.bool),
        torch.tensor(case["lookback_ids"], dtype=torch.int32),
        torch.tensor(case["lookback_dead"], dtype=torch.bool),
    ]
    if "slot_mapping" in inspect.signature(engram.NgramHashState.forward).parameters:  # 0.33's V1 slot cache
        arguments += [None, None]
    ids = engram.NgramHashState.forward(*arguments)
    return {"ids": ids.tolist()}


def ple_rows_case(case: dict) -> dict:
    """Qwen4Exp PLE rows as vLLM 0.33 returns them for a table in `case["dtype"]`: FP8, F.embedding then
    Qwen4ExpPLEFp8EmbeddingMethod.dequantize (rows times the scale, in the output dtype); NVFP4, its
    Triton lookup kernel (_lookup_nvfp4_ple_embedding_kernel, under the interpreter)."""
    import vllm.models.qwen4_exp.common.ngram_embedding as ple
    from vllm.triton_utils import triton

    out_dtype = getattr(torch, case["out_dtype"])
    weight = torch.tensor(case["weight"], dtype=torch.uint8)
    ids = torch.tensor(case["ids"], dtype=torch.int64)
    table_scale = torch.tensor([case["table_scale"]], dtype=torch.float32)
    if case["dtype"] == "fp8-table":
        weight = weight.view(torch.float8_e4m3fn)
        layer = SimpleNamespace(weight_scale=table_scale)
        rows = torch.nn.functional.embedding(ids, weight)
        out = ple.Qwen4ExpPLEFp8EmbeddingMethod().dequantize(layer, rows, out_dtype)
    else:
        scale = torch.tensor(case["scale"], dtype=torch.uint8)
        dim = weight.shape[1] * 2
        # Triton's interpreter truncates a float32 stored into bf16, where the GPU's store rounds to nearest
        # even: the kernel writes float32 here, and torch rounds it as the GPU would.
        out = torch.empty(ids.numel(), dim, dtype=torch.float32)
        ple._lookup_nvfp4_ple_embedding_kernel[(ids.numel(),)](
            weight, scale, table_scale, ids, out, dim, 0, weight.shape[0], BLOCK_D=triton.next_power_of_2(dim)
        )
        out = out.to(out_dtype)
    return {"bits": out.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32).tolist()}


@contextlib.contextmanager
def qwen_parallel_state(etp: int, etp_rank: int, current: SimpleNamespace) -> Iterator[None]:
    """vLLM's parallel state and current config as Qwen4ExpNGramEmbedding reads them: ETP rank `etp_rank`
    of `etp` (its all-reduce the identity, so each rank's own rows show), TP 1, config `current`."""
    from unittest import mock

    import vllm.model_executor.parameter as parameter
    import vllm.models.qwen4_exp.common.ngram_embedding as common
    import vllm.models.qwen4_exp.nvidia.ngram_embedding as nvidia

    group = SimpleNamespace(world_size=etp, rank_in_group=etp_rank, all_reduce=lambda t: t)
    patches = [
        mock.patch.object(common, "get_etp_group", lambda: group),
        mock.patch.object(common, "get_tp_group", lambda: SimpleNamespace(world_size=etp)),
        mock.patch.object(nvidia, "get_etp_group", lambda: group),
        mock.patch.object(nvidia, "get_tp_group", lambda: SimpleNamespace(world_size=1, rank_in_group=0)),
        mock.patch.object(nvidia, "get_current_vllm_config", lambda: current),
        mock.patch.object(parameter, "get_tensor_model_parallel_rank", lambda: 0),
        mock.patch.object(parameter, "get_tensor_model_parallel_world_size", lambda: 1),
    ]
    if "engram.integrations.vllm.qwen" in sys.modules:  # the plugin reads the config too
        patches.append(
            mock.patch.object(sys.modules["engram.integrations.vllm.qwen"], "get_current_vllm_config", lambda: current)
        )
    for patch in patches:
        patch.start()
    try:
        yield
    finally:
        for patch in patches:
            patch.stop()


def qwen_modules(config: Any, weights: dict, max_tokens: int) -> Iterator[tuple[int, Any, set]]:
    """(layer id, module, names loaded) of each PLE layer's Qwen4ExpNGramEmbedding, built by vLLM's own
    constructor (on `layers.{id - 1}`, its dense id the rank among the sorted ids) and loaded through its
    load_weights from the checkpoint tensors under its prefix."""
    import vllm.models.qwen4_exp.nvidia.ngram_embedding as nvidia

    for layer_id in config.ple_layer_ids:
        dense = sorted(set(config.ple_layer_ids)).index(layer_id)
        prefix = f"model.language_model.layers.{layer_id - 1}.ple.ple_embedding"
        module = nvidia.Qwen4ExpNGramEmbedding(
            config,
            config.ple_embed_dim,
            dense,
            max_tokens,
            data_parallel_rank=0,
            prefix=prefix,
            params_dtype=torch.bfloat16,
        )
        mine = [(name.removeprefix(prefix + "."), w) for name, w in weights.items() if name.startswith(prefix + ".")]
        yield layer_id, module, module.load_weights(mine)


def qwen_load_case(case: dict) -> dict:
    """A checkpoint directory loaded through vLLM 0.33's own Qwen4ExpNGramEmbedding (its constructor, its
    load_weights with shard_{k} parts, hash buffers and table scales, its parameters' weight loaders), as
    ETP rank `etp_rank` of `etp` ranks; answers the loaded parameters, or the error vLLM raises."""
    from safetensors.torch import load_file
    from transformers import Qwen4ExpTextConfig

    config = Qwen4ExpTextConfig.from_pretrained(case["path"])
    weights = load_file(f"{case['path']}/model.safetensors")
    out = {}
    with qwen_parallel_state(case["etp"], case["etp_rank"], SimpleNamespace(engram_config=None)):
        try:
            for layer_id, module, loaded in qwen_modules(config, weights, 16):
                table = module.ngram_embedding
                params = {
                    name: param.data.tolist()
                    if param.dtype == torch.float32
                    else param.data.contiguous().view(torch.uint8).tolist()
                    for name, param in table.named_parameters()
                }
                out[str(layer_id)] = {
                    "loaded": sorted(loaded),
                    "row_start": table.shard_indices.org_vocab_start_index,
                    "params": params,
                }
        except ValueError as exc:
            return {"error": str(exc)}
    return out


def engram_table(module: Any) -> Any:
    """The engram table (engram.runtime.table.Table) serving a vLLM table module, or None where the module's
    storage is vLLM's own."""
    return getattr(module, "engram_table", None)


def plugin_qwen_case(case: dict) -> dict:
    """vLLM's Qwen4ExpNGramEmbedding built, loaded (its load_weights) and run (its own ids, its forward)
    three times in one process: before any plugin is loaded, after vLLM loads the general plugins (engram's
    entry point among them) with engram not enabled, and with `additional_config` enabling it. Answers the
    rows of each, the table class, and whether the table lives in an engram mapping."""
    from unittest import mock

    import vllm.models.qwen4_exp.common.ngram_embedding as common
    from safetensors.torch import load_file
    from transformers import Qwen4ExpTextConfig
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    config = Qwen4ExpTextConfig.from_pretrained(case["path"])
    weights = load_file(f"{case['path']}/model.safetensors")
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (40,), generator=generator).to(DEVICE)
    query_start_loc = torch.tensor([0, 17, 40], device=DEVICE)
    ngram_context = torch.full((2, config.ngram_size - 1), config.eos_token_id, device=DEVICE)

    def build(additional: dict, cpu_offload: bool = False, use_thp: bool = False) -> dict:
        """With cpu_offload vLLM builds its pinned-host table; this CPU has no UVA, so vLLM's check for it
        is told yes, the "accelerator view" of a host tensor is the tensor, and the rows are read by the
        table's sync_lookup (vLLM's prefetch path needs CUDA streams)."""
        theirs = SimpleNamespace(
            cpu_offload=True, disk_offload=False, dp_shared_memory=False, use_thp=use_thp, embedding_across_dp=False
        )
        current = SimpleNamespace(
            engram_config=theirs if cpu_offload else None,
            additional_config=additional,
            model_config=SimpleNamespace(model=case["path"]),
            load_config=SimpleNamespace(load_format="safetensors"),
        )
        patches = []
        if cpu_offload and DEVICE == "cpu":
            patches = [
                mock.patch.object(common, "is_uva_available", lambda: True),
                mock.patch.object(common, "get_accelerator_view_from_cpu_tensor", lambda t: t),
            ]
        out = {}
        try:
            with contextlib.ExitStack() as stack, qwen_parallel_state(case["etp"], case["etp_rank"], current):
                for patch in patches:
                    stack.enter_context(patch)
                stack.enter_context(torch.device(DEVICE))  # where vLLM builds its modules
                for layer_id, module, _ in qwen_modules(config, weights, 64):
                    table = module.ngram_embedding
                    ids = module.compute_ngram_ids(input_ids, query_start_loc, ngram_context)
                    if cpu_offload:
                        rows = table.sync_lookup(ids).flatten(-2)
                    else:
                        rows = module(torch.empty(40, 1), input_ids, query_start_loc, ngram_context)
                    ours = engram_table(table)
                    tier = None if ours is None else ours.tier
                    out[str(layer_id)] = {
                        "cached_rows": 0 if tier is None else tier.admission.used,
                        "hits": 0 if tier is None else int(torch.isin(ids, tier.admission.held_rows()).sum()),
                        "class": type(table).__name__,
                        "rows": rows.contiguous().cpu().view(torch.uint8).flatten().tolist(),
                        "engram_storage": ours is not None and ours.stats().placement != "file",
                        "file_backed": ours is not None and ours.stats().placement == "file",
                        "budget_files": len(getattr(getattr(ours, "budget", None), "mappings", ())),
                    }
        except Exception as exc:  # the message is the answer
            return {"error": f"{type(exc).__name__}: {exc}"}
        return out

    from vllm.model_executor.custom_op import op_registry_oot

    for name in ("Qwen4ExpPLEDeviceEmbedding", "Qwen4ExpPLEPinnedHostEmbedding"):  # an earlier case's swap
        op_registry_oot.pop(name, None)
    answer = {"vllm": build({})}
    plugins = load_plugins_by_group(DEFAULT_PLUGINS_GROUP)  # vLLM's own plugin loading
    for func in plugins.values():
        func()
    answer["plugins"] = sorted(plugins)
    answer["disabled"] = build({})
    for name, settings in case["enabled"].items():
        answer[name] = build({"engram": settings})
    answer["host"] = build({"engram": {}}, cpu_offload=True)
    answer["hugepages"] = build({"engram": {}}, cpu_offload=True, use_thp=True)
    answer["file"] = build({"engram": {"file_backed": True}}, cpu_offload=True)
    answer["node"] = build({"engram": {"node_sharing": "node"}}, cpu_offload=True)
    answer["bounded"] = build({"engram": {"file_backed": True, "file_cache_bytes": 1 << 20}}, cpu_offload=True)
    answer["cached"] = build({"engram": case["cache"]}, cpu_offload=True)
    return answer


def deepseek_config(path: str, additional: dict, cpu_offload: bool = False, use_thp: bool = False) -> Any:
    """The parts of vLLM's current config that Engram._create_embedding and the plugin read."""
    return SimpleNamespace(
        additional_config=additional,
        engram_config=SimpleNamespace(
            cpu_offload=cpu_offload,
            disk_offload=False,
            dp_shared_memory=False,
            use_thp=use_thp,
            embedding_across_dp=False,
        ),
        model_config=SimpleNamespace(model=path),
        load_config=SimpleNamespace(load_format="safetensors"),
    )


@contextlib.contextmanager
def deepseek_state(current: Any, tp: int, tp_rank: int) -> Iterator[None]:
    """vLLM's parallel state and current config as Engram._create_embedding reads them (and the plugin,
    when loaded): TP rank `tp_rank` of `tp`, no Engram DP group; on the CPU host tables allowed (no UVA
    here) and a stand-in device's SM count."""
    from unittest import mock

    import vllm.models.deepseek_v41.common.engram as engram

    patches = [
        mock.patch.object(engram, "get_current_vllm_config", lambda: current),
        mock.patch.object(engram, "get_engram_dp_size", lambda: 1),
        mock.patch.object(engram, "get_engram_dp_group", lambda: None),
        mock.patch.object(engram, "get_tensor_model_parallel_world_size", lambda: tp),
        mock.patch.object(engram, "get_tensor_model_parallel_rank", lambda: tp_rank),
    ]
    if DEVICE == "cpu":
        patches += [
            mock.patch.object(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=4)),
            mock.patch.object(torch.accelerator, "current_device_index", lambda: 0),
            mock.patch.object(engram, "is_uva_available", lambda: True),
        ]
    ours = sys.modules.get("engram.integrations.vllm.deepseek")
    if ours is not None:
        patches.append(mock.patch.object(ours, "get_current_vllm_config", lambda: current))
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def plugin_deepseek_case(case: dict) -> dict:
    """DeepSeek V4.1 tables from Engram._create_embedding (vLLM's own factory, then the one engram's entry
    point installs), loaded through their weight loaders from a checkpoint, looked up by each TP rank on
    each layer's ids:
    bf16 rows (vLLM's Triton kernel under the interpreter, or engram's gather) and packed bytes."""
    import vllm.models.deepseek_v41.common.engram as engram
    from safetensors.torch import load_file
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
    weights = load_file(f"{case['path']}/model.safetensors")
    tp = case["tp"]

    def build(additional: dict, tp_rank: int, cpu_offload: bool = False, use_thp: bool = False) -> dict:
        current = deepseek_config(case["path"], additional, cpu_offload, use_thp)
        try:
            out = []
            started = time.perf_counter()
            with deepseek_state(current, tp, tp_rank), torch.device(DEVICE):
                for index, layer_id in enumerate(layout.layer_ids):
                    table = engram.Engram._create_embedding(None, layout, index)
                    ids = torch.tensor(case["ids"][index])  # this layer's ids [T, n_hash_cols]
                    name = f"layers.{layer_id}.engram.embed"
                    table.weight.weight_loader(table.weight, weights[f"{name}.weight"])
                    table.weight_scale_inv.weight_loader(table.weight_scale_inv, weights[f"{name}.scale"])
                    rows = torch.zeros(ids.shape[0], table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
                    table.lookup(ids, rows)
                    first_lookup = time.perf_counter() - started
                    width = table.part_n_hash_cols * (table.dim + table.dim // table.block_size)
                    packed = torch.zeros(ids.shape[0], width, dtype=torch.uint8)
                    table.lookup(ids, packed)
                    ours = engram_table(table)
                    tier = None if ours is None else ours.tier
                    out.append(
                        {
                            "cached_rows": 0 if tier is None else tier.admission.used,
                            "hits": 0 if tier is None else int(torch.isin(ids, tier.admission.held_rows()).sum()),
                            "class": type(table).__name__,
                            "engram_storage": ours is not None and ours.stats().placement != "file",
                            "rows": rows.cpu().view(torch.int16).flatten().tolist(),
                            "packed": packed.cpu().flatten().tolist(),
                            "file_backed": ours is not None and ours.stats().placement == "file",
                            "direct_reads": tier is not None and tier.direct,
                            "tier_hits": 0 if tier is None else tier.stats().hits,
                            "seconds_to_first_lookup": first_lookup,
                        }
                    )
            return {"tables": out}
        except Exception as exc:  # the message is the answer
            return {"error": f"{type(exc).__name__}: {exc}"}

    answer = {"vllm": [build({}, r) for r in range(tp)]}
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
    answer["disabled"] = [build({}, r) for r in range(tp)]
    answer["on"] = [build({"engram": {}}, r) for r in range(tp)]
    answer["file"] = [build({"engram": {"file_backed": True}}, r, cpu_offload=True) for r in range(tp)]
    answer["host"] = [build({"engram": {}}, r, cpu_offload=True) for r in range(tp)]
    answer["hugepages"] = [build({"engram": {}}, r, cpu_offload=True, use_thp=True) for r in range(tp)]
    if "cache" in case:  # engram settings of a device cache
        answer["cached"] = [build({"engram": case["cache"]}, r, cpu_offload=True) for r in range(tp)]
    ram = {"file_backed": True, "ram_cache_bytes": 1 << 20}  # a RAM tier over the file, misses read past the page cache
    os.environ["ENGRAM_DIRECT_READS"] = "1"  # whatever memory this machine has to spare
    answer["ram"] = [build({"engram": ram}, r, cpu_offload=True) for r in range(tp)]
    del os.environ["ENGRAM_DIRECT_READS"]
    return answer


def plugin_file_budget_case(case: dict) -> dict:
    """DeepSeek tables served file-backed through the plugin, with and without a resident-set budget
    (file_cache_bytes), each run from a cold page cache over the same steps' ids: a digest of each step's
    rows beside vLLM's own storage's, the bytes of the checkpoint file in the page cache before the first
    step and after each (mincore), and what the budget counted."""
    import gc
    import hashlib

    import vllm.models.deepseek_v41.common.engram as engram
    from safetensors.torch import load_file
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    from engram.integrations import model_tables
    from engram.runtime.placement.residency import drop_file_cache, resident_bytes

    layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
    path = f"{case['path']}/model.safetensors"

    def run(additional: dict, cpu_offload: bool) -> dict:
        current = deepseek_config(case["path"], additional, cpu_offload)
        weights = load_file(path)
        with deepseek_state(current, 1, 0), torch.device(DEVICE):
            tables = [engram.Engram._create_embedding(None, layout, index) for index in range(len(layout.layer_ids))]
            for table, layer_id in zip(tables, layout.layer_ids, strict=True):
                name = f"layers.{layer_id}.engram.embed"
                table.weight.weight_loader(table.weight, weights[f"{name}.weight"])
                table.weight_scale_inv.weight_loader(table.weight_scale_inv, weights[f"{name}.scale"])
            del weights
            gc.collect()  # safetensors' mapping of the file goes now: the pages it maps cannot be dropped
            drop_file_cache(path)  # cold: no page of the file left from writing or loading it
            first = engram_table(tables[0])
            shard = first.shard if first is not None and first.shard.files else None
            digests, resident = [], [None if shard is None else resident_bytes(shard.files)]
            for step in case["steps"]:
                rows = []
                for table, ids in zip(tables, step, strict=True):
                    out = torch.zeros(len(ids), table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
                    table.lookup(torch.tensor(ids), out)
                    rows.append(out.cpu().view(torch.int16).numpy().tobytes())
                digests.append(hashlib.sha256(b"".join(rows)).hexdigest())
                resident.append(None if shard is None else resident_bytes(shard.files))
        budgets = {id(b): b for b in (getattr(engram_table(t), "budget", None) for t in tables) if b is not None}
        answer = {"digests": digests, "resident": resident, "budgets": len(budgets)}
        for budget in budgets.values():
            answer.update(files=len(budget.mappings), trims=budget.trims, measures=budget.measures, peak=budget.peak)
        del tables
        model_tables.forget_checkpoints()
        gc.collect()  # the tables' mappings go now, not with a later collection: mapped pages stay cached
        return answer

    answer = {"vllm": run({}, cpu_offload=False)}  # vLLM's pinned host tables need a GPU driver
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
    answer["bounded"] = run({"engram": {"file_backed": True, "file_cache_bytes": case["budget"]}}, cpu_offload=True)
    answer["unbounded"] = run({"engram": {"file_backed": True}}, cpu_offload=True)
    return answer


def plugin_collision_case(case: dict) -> dict:
    """engram's entry point where another plugin already replaced vLLM's Qwen4Exp device table class: the
    classes vLLM's out-of-tree registry holds after it, and what engram logged."""
    import logging

    from vllm.model_executor.custom_op import op_registry_oot

    from engram.integrations.vllm import register, swaps

    class Theirs:
        pass

    swapped = list(swaps())
    for name in swapped:
        op_registry_oot.pop(name, None)
    op_registry_oot["Qwen4ExpPLEDeviceEmbedding"] = Theirs
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("engram").addHandler(handler)
    register()
    register()  # vLLM may load the plugins again in the same process
    return {
        "classes": {name: op_registry_oot[name].__name__ for name in swapped},
        "warnings": [r.getMessage() for r in records if r.levelno == logging.WARNING],
    }


def plugin_tier_case(case: dict) -> dict:
    """DeepSeek tables with a tier of engram's (case["settings"]; by default the online device tier with no
    profile), each layer looked up case["repeat"] times on the same ids: a digest of the rows of every
    lookup, against vLLM's own table's; the tier's stats, published at the end unless case["publish"] is
    false (then only the plugin's own publishing has run); and what vLLM's /metrics registry serves, which
    with PROMETHEUS_MULTIPROC_DIR (set by the caller) reads the files the counters were written to."""
    import dataclasses
    import hashlib

    import vllm.models.deepseek_v41.common.engram as engram
    from prometheus_client import generate_latest
    from safetensors.torch import load_file
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
    weights = load_file(f"{case['path']}/model.safetensors")

    def build(additional: dict, cpu_offload: bool) -> list[dict]:
        current = deepseek_config(case["path"], additional, cpu_offload)
        out = []
        with deepseek_state(current, 1, 0), torch.device(DEVICE):
            for index, layer_id in enumerate(layout.layer_ids):
                table = engram.Engram._create_embedding(None, layout, index)
                name = f"layers.{layer_id}.engram.embed"
                table.weight.weight_loader(table.weight, weights[f"{name}.weight"])
                table.weight_scale_inv.weight_loader(table.weight_scale_inv, weights[f"{name}.scale"])
                ids = torch.tensor(case["ids"][index])
                digests = []
                for _ in range(case["repeat"]):
                    rows = torch.zeros(ids.shape[0], table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
                    table.lookup(ids, rows)
                    digests.append(hashlib.sha256(rows.cpu().view(torch.uint8).numpy().tobytes()).hexdigest())
                ours = engram_table(table)
                stats = None
                if ours is not None:
                    from engram.integrations.vllm.metrics import METRICS

                    if case.get("publish", True):  # what a refresh publishes, now, for the comparison
                        METRICS.publish(name, ours)
                    stats = dataclasses.asdict(ours.stats())
                out.append({"digests": digests, "stats": stats})
        return out

    try:
        answer: dict = {"vllm": build({}, False)}
        for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
            func()
        answer["tiered"] = build({"engram": case.get("settings", {"device_cache_bytes": 8 << 20})}, True)
        answer["metrics"] = generate_latest(get_prometheus_registry()).decode()
        return answer
    except Exception as exc:  # the message is the answer
        return {"error": f"{type(exc).__name__}: {exc}"}


KINDS = {
    "version": version_case,
    "config": config_case,
    "qwen_ids": qwen_ids_case,
    "checkpoint_config": checkpoint_config_case,
    "deepseek_layout": deepseek_layout_case,
    "qwen_layout": qwen_layout_case,
    "deepseek_ids": deepseek_ids_case,
    "ple_rows": ple_rows_case,
    "qwen_load": qwen_load_case,
    "plugin_qwen": plugin_qwen_case,
    "plugin_deepseek": plugin_deepseek_case,
    "plugin_file_budget": plugin_file_budget_case,
    "plugin_collision": plugin_collision_case,
    "plugin_tier": plugin_tier_case,
}


def shared_replica(rank: int, case: dict, port: int, results: Any) -> None:
    """One of two DP replicas on this node building DeepSeek tables with engram's shared storage (vLLM's
    node-local Engram DP group is a real gloo group here); rank 1 may die by SIGKILL in the middle of the
    load (`kill_during_load`)."""
    import signal
    from unittest import mock

    import torch.distributed as dist
    import vllm.models.deepseek_v41.common.engram as engram
    from safetensors.torch import load_file
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    from engram.memory.smaps import pss

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        group = SimpleNamespace(
            cpu_group=dist.new_group([0, 1], backend="gloo"), ranks=[0, 1], rank_in_group=rank, world_size=2
        )
        for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
            func()
        current = SimpleNamespace(
            additional_config={"engram": {}},
            engram_config=SimpleNamespace(
                cpu_offload=True, disk_offload=False, dp_shared_memory=True, use_thp=False, embedding_across_dp=False
            ),
        )
        ours = sys.modules["engram.integrations.vllm.deepseek"]
        patches = [
            mock.patch.object(engram, "get_current_vllm_config", lambda: current),
            mock.patch.object(ours, "get_current_vllm_config", lambda: current),
            mock.patch.object(engram, "get_engram_dp_size", lambda: 2),
            mock.patch.object(engram, "get_engram_dp_group", lambda: group),
            mock.patch.object(engram, "get_tensor_model_parallel_world_size", lambda: 1),
            mock.patch.object(engram, "get_tensor_model_parallel_rank", lambda: 0),
            mock.patch.object(engram, "is_uva_available", lambda: True),
            mock.patch.object(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=4)),
            mock.patch.object(torch.accelerator, "current_device_index", lambda: 0),
        ]
        for patch in patches:
            patch.start()
        layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
        weights = load_file(f"{case['path']}/model.safetensors")
        out = []
        for index, layer_id in enumerate(layout.layer_ids):
            table = engram.Engram._create_embedding(None, layout, index)
            name = f"layers.{layer_id}.engram.embed"
            if rank == 1 and case.get("kill_during_load"):
                os.kill(os.getpid(), signal.SIGKILL)
            table.weight.weight_loader(table.weight, weights[f"{name}.weight"])
            table.weight_scale_inv.weight_loader(table.weight_scale_inv, weights[f"{name}.scale"])
            ids = torch.tensor(case["ids"][index])
            rows = torch.zeros(ids.shape[0], table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
            table.lookup(ids, rows)
            mapping = table.engram_table.shard.mapping
            out.append(
                {
                    "rows": rows.view(torch.int16).flatten().tolist(),
                    "pss": pss(mapping.addr, mapping.length),
                    "bytes": mapping.length,
                }
            )
        dist.barrier()
        results.put((rank, out))
    except Exception as exc:  # the message is the answer
        results.put((rank, f"{type(exc).__name__}: {exc}"))
    finally:
        dist.destroy_process_group()


def plugin_shared_case(case: dict) -> dict:
    """Two processes as two DP replicas on one node, sharing DeepSeek tables through the plugin: their rows
    and the PSS of the shared mapping in each (one copy split between two), or, with a replica killed in
    the middle of the load, what the survivor reports; and the shared-memory directory before and after."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = sorted(os.listdir("/dev/shm"))
    os.environ["ENGRAM_DIST_TIMEOUT_S"] = "30"  # a dead peer is reported within this, not 5 minutes
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=shared_replica, args=(rank, case, port, results)) for rank in (0, 1)]
    for worker in workers:
        worker.start()
    answers = {}
    for _ in range(1 if case.get("kill_during_load") else 2):
        rank, answer = results.get(timeout=300)
        answers[str(rank)] = answer
    for worker in workers:
        worker.join(timeout=120)
    return {
        "replicas": answers,
        "exit_codes": [w.exitcode for w in workers],
        "shm_left": sorted(set(os.listdir("/dev/shm")) - set(before)),
    }


KINDS["plugin_shared"] = plugin_shared_case


def node_engine(case: dict, results: Any, go: Any, done: Any) -> None:
    """One of two separately started vLLM module builds (no torch.distributed group between them) of
    DeepSeek tables with engram's node_sharing: its tables' rows, where each came from (loaded here or
    attached) and, once told that every engine has built, the PSS of each table's mapping; it keeps its
    tables until told that every engine has measured (one that exits first would double the other's
    PSS)."""
    import vllm.models.deepseek_v41.common.engram as engram
    from safetensors.torch import load_file
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    from engram.memory.smaps import pss

    try:
        for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
            func()
        section = {"node_sharing": "node", **({"node_dir": case["node_dir"]} if case.get("node_dir") else {})}
        current = deepseek_config(case["path"], {"engram": section}, cpu_offload=True)
        layout = engram.EngramLayout(DeepseekV41Config(text_config=case["hf"]))
        weights = load_file(f"{case['path']}/model.safetensors")
        out, mappings = [], []
        with deepseek_state(current, 1, 0), torch.device(DEVICE):
            for index, layer_id in enumerate(layout.layer_ids):
                table = engram.Engram._create_embedding(None, layout, index)
                name = f"layers.{layer_id}.engram.embed"
                table.weight.weight_loader(table.weight, weights[f"{name}.weight"])  # a node copy: nothing to copy
                table.weight_scale_inv.weight_loader(table.weight_scale_inv, weights[f"{name}.scale"])
                ids = torch.tensor(case["ids"][index])
                rows = torch.zeros(ids.shape[0], table.part_n_hash_cols, table.dim, dtype=torch.bfloat16)
                table.lookup(ids, rows)
                stats = table.engram_table.stats()
                out.append(
                    {
                        "rows": rows.view(torch.int16).flatten().tolist(),
                        "origin": stats.origin,
                        "loaded_by": stats.loaded_by,
                        "bytes": stats.bytes,
                    }
                )
                mappings.append((table, table.engram_table.shard.mapping))
        results.put((os.getpid(), out))
        go.wait(300)
        results.put((os.getpid(), [pss(m.addr, m.length) for _, m in mappings]))
        done.wait(300)
    except Exception as exc:  # the message is the answer
        results.put((os.getpid(), f"{type(exc).__name__}: {exc}"))


def plugin_node_shared_case(case: dict) -> dict:
    """Two independent processes building the same DeepSeek tables through the plugin with node_sharing
    (and case["node_dir"] where given), the second started once the first has built: each one's answer
    (node_engine), their exit codes, where their copy servers listen while both hold their tables, and the
    node copies' memfds, sockets and directory names left once both have exited."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    results, go, done = context.Queue(), context.Event(), context.Event()
    workers = []
    built = {}
    for _ in range(2):
        workers.append(context.Process(target=node_engine, args=(case, results, go, done)))
        workers[-1].start()
        pid, answer = results.get(timeout=300)
        built[pid] = answer
    with open("/proc/net/unix") as f:  # while both hold their tables: where their copy servers listen
        listening = [line.split()[-1] for line in f if "@engram-node-" in line]
    in_dir = sorted(os.listdir(case["node_dir"])) if case.get("node_dir") else []
    go.set()
    measured = dict(results.get(timeout=300) for _ in workers if all(not isinstance(a, str) for a in built.values()))
    done.set()
    for worker in workers:
        worker.join(timeout=120)
    memfds = []
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if pid.isdigit():
                memfds += [
                    fd for fd in os.listdir(f"/proc/{pid}/fd") if "engram-node" in os.readlink(f"/proc/{pid}/fd/{fd}")
                ]
    with open("/proc/net/unix") as f:
        sockets = [line.split()[-1] for line in f if "@engram-node-" in line or "@engram-load-" in line]
    return {
        "engines": [{"pid": w.pid, "built": built.get(w.pid), "pss": measured.get(w.pid)} for w in workers],
        "exit_codes": [w.exitcode for w in workers],
        "left": {"memfds": memfds, "sockets": sockets},
        "abstract_servers_while_built": len(listening),
        "node_dir_while_built": in_dir,
        "node_dir_left": sorted(os.listdir(case["node_dir"])) if case.get("node_dir") else [],
    }


KINDS["plugin_node_shared"] = plugin_node_shared_case


def plugin_register_case(case: dict) -> dict:
    """engram's entry point as vLLM calls it, in a fresh process, with vLLM's version string replaced by
    case["version"] (None: as installed) and, with case["break"], one internal engram needs removed first:
    whether it raised, what it swapped or routed, what it logged, and what vLLM's config check then makes
    of no engram section and of one (the error, or None)."""
    import logging

    import vllm
    import vllm.models.deepseek_v41.common.engram as vllm_engram
    from vllm.config.vllm import VllmConfig
    from vllm.model_executor.custom_op import op_registry_oot

    if case.get("version"):
        vllm.__version__ = case["version"]
    if case.get("break"):
        import vllm.models.qwen4_exp.common.ngram_embedding as common

        del common.Qwen4ExpPLEFp8EmbeddingMethod  # an internal engram imports, gone
    factory = vllm_engram.Engram._create_embedding
    check = VllmConfig._resolve_and_verify_engram_config
    before = dict(op_registry_oot)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("engram").addHandler(handler)
    from engram.integrations.vllm import register

    raised = None
    try:
        register()
        register()  # vLLM may load the plugins again in the same process
    except BaseException as exc:
        raised = f"{type(exc).__name__}: {exc}"

    def verdict(additional: dict) -> str | None:
        current = SimpleNamespace(
            additional_config=additional,
            engram_config=None,
            model_config=None,
            speculative_config=None,
            parallel_config=SimpleNamespace(use_ubatching=False),
        )
        try:
            VllmConfig._resolve_and_verify_engram_config(current)
        except ValueError as exc:
            return str(exc)
        return None

    return {
        "raised": raised,
        "swapped": sorted(name for name in op_registry_oot if name not in before),
        "factory_routed": vllm_engram.Engram._create_embedding is not factory,
        "check_wrapped": VllmConfig._resolve_and_verify_engram_config is not check,
        "warnings": [r.getMessage() for r in records if r.levelno >= logging.WARNING],
        "without_section": verdict({}),
        "with_section": verdict({"engram": {"file_backed": True}}),
    }


KINDS["plugin_register"] = plugin_register_case


def recorded(method: Any, name: str, calls: list[str]) -> Any:
    """Table.`name` that appends "name table" to `calls` as it is called."""

    def call(table: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(f"{name} {table.name}")
        return method(table, *args, **kwargs)

    return call


def plugin_disk_offload_case(case: dict) -> dict:
    """vLLM 0.34's disk offload (EngramConfig.disk_offload) of a Qwen4Exp checkpoint split into parts: each
    PLE layer's Qwen4ExpNGramEmbedding built by vLLM's constructor, loaded by its load_weights (the parts
    handed over as the safetensors library maps them), bound by its process_weights_after_loading, staged
    by its own stage_checkpoint_rows and read by its forward; once as vLLM serves it, then after the plugins
    are loaded with each engram section of case["sections"]. Answers each build's rows, table class and
    whether engram's file-backed table served it (with its tier's stats), and the prefetches and lookups
    of engram's tables in order ("calls"). With case["together"] every layer is staged in one
    stage_checkpoint_rows a step, as vLLM's model runner stages them; else each alone. case["etp"] and
    case["etp_rank"]: the ETP group it is built in (default 1, 0)."""
    import dataclasses

    import vllm.models.qwen4_exp.nvidia.ngram_embedding as nvidia
    from safetensors import safe_open
    from transformers import Qwen4ExpTextConfig
    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_plugins_by_group

    config = Qwen4ExpTextConfig.from_pretrained(case["path"])
    weights = {}
    for path in sorted(os.listdir(case["path"])):
        if path.endswith(".safetensors"):
            handle = safe_open(os.path.join(case["path"], path), framework="pt")  # kept open: its tensors map the file
            weights.update({name: handle.get_tensor(name) for name in handle.keys()})  # noqa: SIM118
    generator = torch.Generator().manual_seed(1)
    steps = []
    for tokens in case["steps"]:
        input_ids = torch.randint(0, config.vocab_size, (tokens,), generator=generator)
        half = tokens // 2
        steps.append(
            (input_ids, torch.tensor([0, half, tokens]), torch.full((2, config.ngram_size - 1), config.eos_token_id))
        )

    def build(additional: dict) -> dict:
        theirs = SimpleNamespace(
            cpu_offload=True, disk_offload=True, dp_shared_memory=False, use_thp=False, embedding_across_dp=False
        )
        current = SimpleNamespace(
            engram_config=theirs,
            additional_config=additional,
            model_config=SimpleNamespace(model=case["path"]),
            load_config=SimpleNamespace(load_format="safetensors"),
        )
        out = {}
        try:
            from unittest import mock

            etp = (case.get("etp", 1), case.get("etp_rank", 0))  # the ETP rank it is built as
            with contextlib.ExitStack() as stack, qwen_parallel_state(*etp, current):
                stack.enter_context(mock.patch.object(nvidia, "get_current_vllm_config", lambda: current))
                modules = list(qwen_modules(config, weights, max(case["steps"])))
                for _, module, _ in modules:
                    table = module.ngram_embedding
                    table.embedding_method.process_weights_after_loading(table)
                calls: list[str] = []  # engram's prefetches and lookups, in order, by layer
                if "engram.runtime.table" in sys.modules:
                    table_class = sys.modules["engram.runtime.table"].Table
                    for method in ("prefetch", "lookup"):
                        real = getattr(table_class, method)
                        stack.enter_context(mock.patch.object(table_class, method, recorded(real, method, calls)))
                rows: dict[int, list] = {layer_id: [] for layer_id, _, _ in modules}
                # each layer staged alone, step after step, or (together) every layer's rows at each step
                runs = [modules] if case.get("together") else [[each] for each in modules]
                for run in runs:
                    for input_ids, query_start_loc, ngram_context in steps:
                        staged = [(module, module.ngram_embedding) for _, module, _ in run]
                        nvidia.stage_checkpoint_rows(staged, input_ids, query_start_loc, ngram_context)
                        for layer_id, module, _ in run:
                            got = module(torch.empty(input_ids.shape[0], 1), input_ids, query_start_loc, ngram_context)
                            rows[layer_id].append(got.contiguous().view(torch.uint8).flatten().tolist())
                for layer_id, module, _ in modules:
                    table = module.ngram_embedding
                    engram = getattr(table, "engram_table", None)
                    stats = None if engram is None else dataclasses.asdict(engram.stats())
                    out[str(layer_id)] = {"class": type(table).__name__, "rows": rows[layer_id], "stats": stats}
                out["calls"] = calls
        except Exception as exc:  # the message is the answer
            return {"error": f"{type(exc).__name__}: {exc}"}
        return out

    op_registry_oot.pop("Qwen4ExpPLEDiskOffloadEmbedding", None)
    answer = {"vllm": build({})}
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
    answer["disabled"] = build({})
    for name, section in case["sections"].items():
        answer[name] = build({"engram": section})
    return answer


KINDS["plugin_disk_offload"] = plugin_disk_offload_case


if __name__ == "__main__":
    # Answers go to the stdout the caller reads, alone: anything else any process writes there (vLLM logs to
    # stdout, and the processes a case starts inherit it) goes to stderr instead.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        case = json.loads(line)
        print(json.dumps(KINDS[case["kind"]](case)), file=answers, flush=True)
