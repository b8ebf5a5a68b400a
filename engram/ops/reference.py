"""The ops in plain torch: the oracle every kernel is tested against, and the fallback where the native
CPU twins cannot be built."""

from __future__ import annotations

from typing import Any

import torch

from engram.errors import EngramError
from engram.ops.checks import (
    NVFP4_BLOCK,
    QUANT_NVFP4,
    SCALE_BLOCK,
    GatherCall,
    check_gather_args,
    check_ids,
    row_format,
)

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def gather_reference(*args: Any, **named: Any) -> torch.Tensor:
    """The gather in plain torch: what every kernel is tested against, and the fallback. Takes the
    ops' arguments (engram.ops.gather), or one GatherCall; `sorted` and `check` change nothing here, and a
    kept buffer as `out` gives its dtype. Returns a fresh output."""
    call = args[0] if len(args) == 1 and isinstance(args[0], GatherCall) else GatherCall(*args, **named)
    if not isinstance(call.weight, torch.Tensor) or not isinstance(call.scale, torch.Tensor | None):
        raise EngramError(
            "rows in pieces of a checkpoint's files are read by the native CPU kernels only; build them (a C compiler with OpenMP)"
        )
    check_gather_args(call)
    check_ids(call.ids, call.table_rows)
    weight, scale, ids, row_start = call.weight, call.scale, call.ids, call.row_start
    out_dtype, table_scale = call.out_dtype, call.table_scale
    quant, dim = row_format(weight, scale, table_scale)
    if table_scale is not None:
        return _table_scaled(weight, scale, ids, row_start, out_dtype, table_scale, quant == QUANT_NVFP4, dim)
    flat = ids.reshape(-1).to(torch.int64)
    local = flat - row_start
    owned = (flat >= 0) & (local >= 0) & (local < weight.shape[0])
    index = torch.where(owned, local, 0)
    rows = weight.index_select(0, index) if weight.shape[0] else weight.new_zeros((flat.numel(), weight.shape[1]))
    if scale is not None:
        scales = (
            scale.index_select(0, index) if scale.shape[0] else scale.new_zeros((flat.numel(), scale.shape[1]))
        ).float()
        blocks = weight.shape[1] // SCALE_BLOCK
        values = (
            (rows.float().view(flat.numel(), blocks, SCALE_BLOCK) * scales[:, :, None])
            .view(flat.numel(), weight.shape[1])
            .to(out_dtype)
        )
    else:
        values = rows.to(out_dtype)
    zero_unowned(values, owned)
    return values.view(*ids.shape, weight.shape[1])


def _table_scaled(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    out_dtype: torch.dtype,
    table_scale: float,
    nvfp4: bool,
    dim: int,
) -> torch.Tensor:
    """Rows with one scale per table, as vLLM 0.33 dequantises Qwen4Exp's: fp8 times the scale cast to the
    output dtype; NVFP4 as (e2m1 value * its block's e4m3 scale) * the table scale, in float."""
    flat = ids.reshape(-1).to(torch.int64)
    local = flat - row_start
    owned = (flat >= 0) & (local >= 0) & (local < weight.shape[0])
    index = torch.where(owned, local, 0)
    rows = weight.index_select(0, index) if weight.shape[0] else weight.new_zeros((flat.numel(), weight.shape[1]))
    if nvfp4:
        assert scale is not None
        scales = scale.index_select(0, index) if scale.shape[0] else scale.new_zeros((flat.numel(), scale.shape[1]))
        codes = torch.stack([rows & 0xF, rows >> 4], dim=2).reshape(flat.numel(), dim).long()
        blocks = scales.float().repeat_interleave(NVFP4_BLOCK, dim=1)
        values = (E2M1[codes] * blocks) * torch.tensor(table_scale, dtype=torch.float32)
    else:
        factor = torch.tensor(table_scale, dtype=torch.float32).to(out_dtype).float()
        values = rows.float() * factor
    values = values.to(out_dtype)
    zero_unowned(values, owned)
    return values.view(*ids.shape, dim)


def zero_unowned(values: torch.Tensor, owned: torch.Tensor) -> None:
    """+0.0 in the rows of `values` [N, W] that `owned` [N] leaves out, by their bits: fp8 and other raw
    dtypes have no masked fill in torch."""
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[values.element_size()]
    values.view(bits)[~owned] = 0


def ngram_hash_reference(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    out: torch.Tensor,
) -> None:
    """The hash in plain torch ops over the whole batch (the reference, and the fallback). ext: [ctx + T]
    history then new ids; start: [T] lowest readable index of ext per token; multipliers [L, N]; primes,
    offsets [L, C]; out [T, L, C]."""
    tokens = start.numel()
    layers, max_ngram = multipliers.shape
    heads = primes.shape[1] // (max_ngram - 1)
    position = torch.arange(ext.numel() - tokens, ext.numel(), dtype=torch.int64, device=ext.device)
    by_order = out.view(tokens, layers, max_ngram - 1, heads)
    primes, offsets = primes.view(layers, max_ngram - 1, heads), offsets.view(layers, max_ngram - 1, heads)
    mix = None
    for k in range(max_ngram):
        at = position - k
        word = torch.where(at >= start, ext[at], fill)
        term = word[:, None] * multipliers[None, :, k]  # [T, L]; < 2^63 by the multiplier bound
        mix = term if mix is None else mix ^ term
        if k >= 1:
            by_order[:, :, k - 1, :] = (
                torch.remainder(mix[:, :, None], primes[None, :, k - 1, :]) + offsets[None, :, k - 1, :]
            )
