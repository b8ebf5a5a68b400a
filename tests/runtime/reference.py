"""The rows a lookup must return, independently of engram's loader and gather: a checkpoint's tensors read
with safetensors' own reader (`safetensors.torch.load_file`), each row format dequantised from its
definition in float64 (DeepSeek V4.1's fp8 with ue8m0 block-32 scales; Qwen4Exp's fp8 with one table
scale and NVFP4 as vLLM 0.33 dequantises them), then rounded once to the output dtype. Also: a
checkpoint's rows planted with negative zeros, the value a float sum of row shards loses."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.digests import write_manifest

DEAD_ID = -1
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NEGATIVE_ZERO = {  # each stored dtype's encoding of -0.0, as the integer of its width
    torch.bfloat16: -0x8000,
    torch.float16: -0x8000,
    torch.float32: -0x80000000,
    torch.float8_e4m3fn: 0x80,
    torch.uint8: 0x08,  # NVFP4: e2m1 code 8 (-0.0) in the low nibble, 0 (+0.0) in the high one
}


def read_tensors(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint's safetensors files, by name, as safetensors reads them."""
    out: dict[str, torch.Tensor] = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


def e4m3(bits: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn from its bits: sign, 4 exponent bits (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    b = bits.to(torch.int64)
    sign = torch.where(b & 0x80 != 0, -1.0, 1.0).to(torch.float64)
    exponent, mantissa = (b >> 3) & 0xF, (b & 7).to(torch.float64)
    normal = (1 + mantissa / 8) * torch.exp2((exponent - 7).to(torch.float64))
    value = torch.where(exponent == 0, mantissa * 2.0**-9, normal)
    return torch.where((exponent == 0xF) & (b & 7 == 7), torch.nan, sign * value)


def ue8m0(bits: torch.Tensor) -> torch.Tensor:
    """float8_e8m0fnu: 2^(bits - 127), 255 is NaN."""
    b = bits.to(torch.float64)
    return torch.where(b == 255, torch.nan, torch.exp2(b - 127))


def e2m1(codes: torch.Tensor) -> torch.Tensor:
    """FP4 e2m1 from its 4-bit codes: bit 3 the sign, then E2M1's eight magnitudes."""
    magnitude = torch.tensor(E2M1, dtype=torch.float64)[codes & 7]
    return torch.where(codes & 8 != 0, -magnitude, magnitude)


def dequantise(tensors: dict[str, torch.Tensor], table: str, dtype: str, out_dtype: torch.dtype) -> torch.Tensor:
    """The whole table [rows, dim] in `out_dtype`, from its checkpoint tensors."""
    weight = tensors[f"{table}.weight"]
    if dtype == "fp8":  # value * 2^(e - 127) of its block of 32
        scale = ue8m0(tensors[f"{table}.scale"].view(torch.uint8)).repeat_interleave(32, dim=1)
        return (e4m3(weight.view(torch.uint8)) * scale).to(out_dtype)
    if dtype == "fp8-table":  # vLLM: rows.to(out) * weight_scale.to(out), one rounding of an exact product
        factor = tensors[f"{table}.weight_scale"].to(out_dtype).double()
        return (e4m3(weight.view(torch.uint8)) * factor).to(out_dtype)
    if dtype == "nvfp4":  # vLLM: (e2m1 * its block-16 e4m3 scale) * weight_scale_2 in float32, then out
        codes = torch.stack([weight & 0xF, weight >> 4], dim=2).reshape(weight.shape[0], -1).to(torch.int64)
        blocks = e4m3(tensors[f"{table}.weight_scale"].view(torch.uint8)).repeat_interleave(16, dim=1)
        second = tensors[f"{table}.weight_scale_2"].double()
        return (e2m1(codes) * blocks * second).to(torch.float32).to(out_dtype)
    return weight.double().to(out_dtype)  # bf16, fp16, fp32: the value, rounded once


def pick(rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[*ids.shape, D]: the rows [rows, D] of a dequantised table for global row ids, +0.0 for DEAD_ID."""
    index = ids.to(torch.int64)
    picked = rows[index.clamp(min=0)]
    return torch.where((index == DEAD_ID)[..., None], torch.zeros((), dtype=rows.dtype), picked)


def expected_tables(
    checkpoint: str | Path, spec: ModelSpec, out_dtype: torch.dtype = torch.bfloat16
) -> dict[str, torch.Tensor]:
    """Every table of the checkpoint, by name, dequantised once into `out_dtype`."""
    tensors = read_tensors(checkpoint)
    return {name: dequantise(tensors, name, spec.dtype, out_dtype) for name in spec.table_names()}


def expected_lookup(tables: dict[str, torch.Tensor], spec: ModelSpec, ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, [T, C, D]: the rows of ids [T, layers, C] (global row ids of each layer's table)."""
    names = spec.table_names()
    return [pick(tables[names[table]], ids[:, layer]) for layer, table in enumerate(spec.layout.table_of_layer)]


def plant_negative_zeros(checkpoint: str | Path, spec: ModelSpec, every: int = 5) -> int:
    """Rewrite the checkpoint's tables with every `every`-th stored element of each row a negative zero
    (staggered by row, so each row has some), through safetensors' own reader and writer. The table
    scales keep every planted value a -0.0 row element. Returns how many elements were planted."""
    planted = 0
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        tensors = load_file(str(path))
        for name in spec.table_names():
            weight = tensors.get(f"{name}.weight")
            if weight is None:
                continue
            bits = weight.view(INTEGERS[weight.element_size()])
            rows, width = bits.shape
            mask = (torch.arange(rows)[:, None] + torch.arange(width)[None, :]) % every == 0
            bits[mask] = NEGATIVE_ZERO[weight.dtype]
            planted += int(mask.sum())
        save_file(tensors, str(path))
        write_manifest(path.parent, [path])  # the SHA256SUMS beside it, of the planted bytes
    return planted
