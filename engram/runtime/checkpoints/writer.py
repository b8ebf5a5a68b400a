"""Deterministic synthetic checkpoints in the real tensor naming, for tests and the demo.

`{table}.weight` [rows, D] and the scales of its row format (engram.ops.formats, quantize), plus a
config.json with the model's architecture and n-gram fields in the layout vLLM 0.33 reads (hf_config).
Same preset, dtype and seed: same bytes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.ops.formats import FORMATS
from engram.output_files import OutputDirectory
from engram.runtime.checkpoints.digests import MANIFEST, manifest_text
from engram.runtime.checkpoints.quantize import E2M1_MAX, E4M3_MAX, quantize_fp8, quantize_fp8_table, quantize_nvfp4
from engram.runtime.shard import ShardFormat

TABLE_RANGE = 0.25  # what a table scale covers in the synthetic tables
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
VLLM_PLE_DTYPES = {"fp8-table": "float8_e4m3fn", "nvfp4": "nvfp4"}  # Qwen4Exp's ple_embedding_dtype
CHUNK_ROWS = 1 << 16


def synthetic_table(rows: int, dim: int, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    """A table's checkpoint tensors by suffix (weight, block scales, the table scale), drawn from one seed:
    normal values of spread 0.05, clamped to [-0.25, 0.25] where a table scale must cover them."""
    f = FORMATS[dtype]
    generator = torch.Generator().manual_seed(seed)
    weight = torch.empty((rows, f.weight_width(dim)), dtype=f.weight)
    scale = torch.empty((rows, f.scale_width(dim)), dtype=f.scale) if f.scale is not None else None
    table_scale = TABLE_RANGE / (E4M3_MAX if dtype == "fp8-table" else E2M1_MAX * E4M3_MAX)
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        values = torch.randn((stop - start, dim), generator=generator) * 0.05
        if dtype == "fp8":
            weight[start:stop], scale[start:stop] = quantize_fp8(values)  # type: ignore[index]
        elif dtype == "fp8-table":
            weight[start:stop] = quantize_fp8_table(values, table_scale)
        elif dtype == "nvfp4":
            weight[start:stop], scale[start:stop] = quantize_nvfp4(values.clamp(-TABLE_RANGE, TABLE_RANGE), table_scale)  # type: ignore[index]
        else:
            weight[start:stop] = values.to(weight.dtype)
    out = {"weight": weight}
    if scale is not None:
        out[f.scale_name] = scale
    if f.table_scale:
        out[f.table_scale_name] = torch.tensor(table_scale, dtype=torch.float32)
    return out


def hf_config(spec: ModelSpec, dtype: str, seed: int) -> dict[str, Any]:
    """config.json as vLLM 0.33 reads it: the model_type its config registry knows, and the fields its
    layout code takes. DeepSeek V4.1 nests the text fields under text_config (DeepseekV41Config flattens
    them), names the pad `engram_pad_token_id`, takes one `engram_vocab_size` for every order (a per-order
    list stays a list: vLLM cannot read it) and each layer's table rows as `engram_num_embeddings`.
    engram's own keys say which preset, dtype and fill seed wrote the tables."""
    fields = dict(spec.hf_text_config)
    ours = {"engram_preset": spec.name, "engram_dtype": dtype, "engram_checkpoint_seed": seed}
    if spec.family == "qwen":
        fields.setdefault("seed", fields.pop("ngram_seed", 1234))
        fields["dtype"] = TORCH_NAMES.get(dtype, "bfloat16")
        if dtype in VLLM_PLE_DTYPES:
            fields["ple_embedding_dtype"] = VLLM_PLE_DTYPES[dtype]
        return {"architectures": [spec.architecture], "model_type": "qwen4_exp_text", **fields, **ours}
    bases = fields["engram_vocab_size"]
    if isinstance(bases, list) and len(set(bases)) == 1:
        fields["engram_vocab_size"] = bases[0]
    fields["engram_pad_token_id"] = fields.pop("engram_pad_id", fields.get("engram_pad_token_id"))
    fields["engram_num_embeddings"] = list(spec.layout.table_rows)
    return {"architectures": [spec.architecture], "model_type": "deepseek_v41", "text_config": fields, **ours}


def vllm_refusals(spec: ModelSpec, dtype: str, split_parts: int | None = None) -> list[str]:
    """Why vLLM 0.33 could not serve these tables (empty where it can): engram serves them either way."""
    why = []
    fields = spec.hf_text_config
    if spec.family == "deepseek":
        if dtype != "fp8":
            why.append(f"its DeepSeek V4.1 tables are always fp8 with ue8m0 block scales, not {dtype}")
        bases = fields.get("engram_vocab_size")
        if isinstance(bases, list) and len(set(bases)) > 1:
            why.append(f"it reads one engram_vocab_size for every order, not the per-order list {bases}")
        if fields.get("engram_seed", 0):
            why.append("it ignores engram_seed (its multipliers are seeded by the layer id alone)")
    else:
        if dtype == "fp8":
            why.append("its Qwen4Exp fp8 tables take one scale per table (fp8-table), not ue8m0 block scales")
        if dtype == "nvfp4" and split_parts is None:
            why.append("its Qwen4Exp NVFP4 tables load only as shard_<k> parts: pass --split-parts")
        if spec.ple_tables == "shared":
            why.append("it gives every PLE layer a table of its own, not one shared table")
    return why


def hash_buffers(spec: ModelSpec) -> dict[str, torch.Tensor]:
    """The hash buffers vLLM's Qwen4Exp modules keep persistent, per PLE layer (none for DeepSeek)."""
    if spec.family != "qwen" or spec.ple_tables != "per-layer":
        return {}
    layout = spec.layout
    layers = len(layout.layer_ids)
    out = {}
    for layer, table in enumerate(spec.table_names()):
        module = table.removesuffix(".ngram_embedding")
        out[f"{module}.layer_multipliers"] = torch.from_numpy(layout.multipliers[layer].copy())
        out[f"{module}.ngram_heads_offsets"] = torch.from_numpy(layout.offsets.reshape(layers, -1)[layer].copy())
        out[f"{module}.ngram_heads_vocab_sizes"] = torch.from_numpy(layout.primes.reshape(layers, -1)[layer].copy())
    return out


def split(name: str, tensors: dict[str, torch.Tensor], parts: int | None) -> dict[str, torch.Tensor]:
    """A table's tensors whole, or as vLLM's `{name}.shard_{k}.{part}` pieces of ceil(rows / parts) rows."""
    if parts is None:
        return {f"{name}.{part}": tensor for part, tensor in tensors.items()}
    out = {}
    for part, tensor in tensors.items():
        if tensor.dim() == 0:  # the table scale: one value for all parts
            out[f"{name}.{part}"] = tensor
            continue
        size = -(-tensor.shape[0] // parts)
        for k in range(parts):
            if k * size < tensor.shape[0]:
                out[f"{name}.shard_{k}.{part}"] = tensor[k * size : (k + 1) * size].clone()
    return out


def write_checkpoint(
    spec: ModelSpec,
    out: Path,
    *,
    dtype: str | None = None,
    seed: int = 0,
    fmt: str = "safetensors",
    split_parts: int | None = None,
) -> Path:
    """`split_parts`: write each table as that many `shard_{k}` parts (vLLM's split_ngram_parts)."""
    dtype = dtype or spec.dtype
    if split_parts is not None and not 1 <= split_parts <= 1 << 20:
        raise EngramError(f"split parts must be between 1 and {1 << 20}, got {split_parts}")
    if fmt not in ("safetensors", "pt"):
        raise EngramError(f"format must be safetensors or pt, got {fmt!r}")
    need = sum(ShardFormat(rows, spec.head_dim, dtype).nbytes for rows in spec.layout.table_rows)
    name = f"model.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    with OutputDirectory("the checkpoint directory", out, private=True, create=True) as directory:
        free = shutil.disk_usage(directory.where("")).free
        if need * 2 > free:  # the file, and the tensors in memory while writing
            raise EngramError(
                f"{spec.name} in {dtype} needs {need:,} bytes on disk but only {free:,} are free in {out}; pick a smaller preset (tiny, demo)"
            )
        tensors = hash_buffers(spec)
        for index, (table, rows) in enumerate(zip(spec.table_names(), spec.layout.table_rows, strict=True)):
            tensors.update(split(table, synthetic_table(rows, spec.head_dim, dtype, seed * 1000 + index), split_parts))
        with directory.staged(name) as scratch:  # unguessable, in a directory only we can write
            if fmt == "safetensors":
                save_file(tensors, directory.where(scratch))  # no metadata: safetensors writes it in hash order
            else:
                torch.save(tensors, directory.where(scratch))
        del tensors
        config = hf_config(spec, dtype, seed)
        if split_parts is not None:
            config.get("text_config", config)["split_ngram_parts"] = split_parts
        directory.write("config.json", (json.dumps(config, indent=2) + "\n").encode())
        directory.write(MANIFEST, manifest_text([Path(directory.where(name))]).encode())
    return out / name
