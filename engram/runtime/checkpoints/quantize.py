"""Float rows into every scaled row format (engram.ops.formats), as checkpoints store them: what the
synthetic checkpoints are made of, so every dequantising kernel is tested on rows of its real layout."""

from __future__ import annotations

import torch

from engram.ops.formats import FORMATS

E4M3_MAX = 448.0
E2M1_MAX = 6.0
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_BLOCK = FORMATS["fp8"].block
NVFP4_BLOCK = FORMATS["nvfp4"].block


def quantize_fp8(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [rows, D] -> (e4m3 [rows, D], ue8m0 [rows, D/32]) with value = fp8 * 2^(e - 127): one
    power-of-two scale per block of 32, chosen so the block's largest value fits e4m3's range."""
    blocks = values.view(values.shape[0], -1, FP8_BLOCK)
    amax = blocks.abs().amax(dim=2).clamp_min(2.0**-100)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    quantized = (blocks / scale[:, :, None]).to(torch.float8_e4m3fn).view(values.shape)
    return quantized, scale.to(torch.float8_e8m0fnu)


def quantize_fp8_table(values: torch.Tensor, table_scale: float) -> torch.Tensor:
    """float32 [rows, D] -> e4m3 [rows, D] with value = fp8 * table_scale (values beyond the range clamp)."""
    limit = E4M3_MAX * table_scale
    return (values.clamp(-limit, limit) / table_scale).to(torch.float8_e4m3fn)


def quantize_nvfp4(values: torch.Tensor, table_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [rows, D] -> (uint8 [rows, D/2], e4m3 [rows, D/16]) with value = e2m1 * block scale *
    table_scale: the block scale maps the block's largest value to e2m1's 6, each value takes the nearest
    e2m1 code, and a byte holds two codes, the even element in its low nibble."""
    rows, dim = values.shape
    blocks = values.view(rows, dim // NVFP4_BLOCK, NVFP4_BLOCK)
    amax = blocks.abs().amax(dim=2)
    scale = (amax / (E2M1_MAX * table_scale)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    step = (scale.float() * table_scale).clamp_min(torch.finfo(torch.float32).tiny)
    ratio = (blocks / step[:, :, None]).reshape(rows, dim)
    magnitude = (ratio.abs()[..., None] - E2M1_GRID).abs().argmin(dim=-1)
    codes = (magnitude | ((ratio < 0) & (magnitude > 0)).to(torch.int64) << 3).to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), scale
