"""Deterministic synthetic checkpoints in the real tensor naming, for tests and the demo.

`{table}.weight` [rows, D] and, for fp8, `{table}.scale` [rows, D/32] (ue8m0: one power-of-two scale per
block of 32, chosen so the block's largest value fits e4m3's range), plus a config.json with the
model's architecture and n-gram fields. Same preset, dtype and seed: same bytes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.digests import write_manifest
from engram.runtime.placement.storage import SCALE_BLOCK, SCALE_DTYPE, WEIGHT_DTYPES, ShardFormat

E4M3_MAX = 448.0
CHUNK_ROWS = 1 << 16


def quantize_fp8(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [rows, D] -> (e4m3 [rows, D], ue8m0 [rows, D/32]) with value = fp8 * 2^(e - 127)."""
    blocks = values.view(values.shape[0], -1, SCALE_BLOCK)
    amax = blocks.abs().amax(dim=2).clamp_min(2.0**-100)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    quantized = (blocks / scale[:, :, None]).to(torch.float8_e4m3fn).view(values.shape)
    return quantized, scale.to(SCALE_DTYPE)


def synthetic_table(rows: int, dim: int, dtype: str, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    weight = torch.empty((rows, dim), dtype=WEIGHT_DTYPES[dtype])
    scale = torch.empty((rows, dim // SCALE_BLOCK), dtype=SCALE_DTYPE) if dtype == "fp8" else None
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        values = torch.randn((stop - start, dim), generator=generator) * 0.05
        if scale is not None:
            weight[start:stop], scale[start:stop] = quantize_fp8(values)
        else:
            weight[start:stop] = values.to(weight.dtype)
    return {"weight": weight} if scale is None else {"weight": weight, "scale": scale}


def write_checkpoint(
    spec: ModelSpec, out: Path, *, dtype: str | None = None, seed: int = 0, fmt: str = "safetensors"
) -> Path:
    dtype = dtype or spec.dtype
    if fmt not in ("safetensors", "pt"):
        raise EngramError(f"format must be safetensors or pt, got {fmt!r}")
    need = sum(ShardFormat(rows, spec.head_dim, dtype).nbytes for rows in spec.layout.table_rows)
    out.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out).free
    if need * 2 > free:  # the file, and the tensors in memory while writing
        raise EngramError(
            f"{spec.name} in {dtype} needs {need:,} bytes on disk but only {free:,} are free in {out.parent}; pick a smaller preset (tiny, demo)"
        )
    tensors: dict[str, torch.Tensor] = {}
    for index, (name, rows) in enumerate(zip(spec.table_names(), spec.layout.table_rows, strict=True)):
        for part, tensor in synthetic_table(rows, spec.head_dim, dtype, seed * 1000 + index).items():
            tensors[f"{name}.{part}"] = tensor
    target = out / f"model.{'safetensors' if fmt == 'safetensors' else 'pt'}"
    tmp = target.with_suffix(target.suffix + ".tmp")
    if fmt == "safetensors":
        save_file(tensors, str(tmp))  # no metadata: safetensors writes it in hash order, not byte-stable
    else:
        torch.save(tensors, tmp)
    os.replace(tmp, target)
    config = {
        "architectures": [spec.architecture],
        **spec.hf_text_config,
        "engram_preset": spec.name,
        "engram_dtype": dtype,
        "engram_seed": seed,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_manifest(out, [target])
    return target
