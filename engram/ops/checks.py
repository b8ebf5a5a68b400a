"""What every gather and hash is checked against before any kernel runs: dtypes, shapes, devices and the
ranges of ids. The kernels trust these extents (a scale with fewer rows than the weight would be read past
its end), and raise nothing themselves."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engram.errors import EngramError

DEAD_ID = -1

SCALE_BLOCK = 32

OUT_KINDS = {torch.float32: 1, torch.bfloat16: 2}

ID_DTYPES = (torch.int64, torch.int32)

TABLE_DTYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32, torch.uint8)

SCALE_DTYPE = torch.float8_e8m0fnu


def check_ids(ids: torch.Tensor, table_rows: int) -> None:
    """Ids outside [-1, table_rows) are an error, raised before any row is read (a host sync on a GPU:
    the engine checks once per step instead, see engram.ops.cuda.ErrorFlag)."""
    if ids.numel() == 0:
        return
    bad = ids[(ids < DEAD_ID) | (ids >= table_rows)]
    if bad.numel():
        raise EngramError(f"row id {int(bad[0])} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")


def describe(t: torch.Tensor) -> str:
    return f"{t.dtype} {list(t.shape)} on {t.device}"


def check_gather_args(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
) -> None:
    """Every argument of a gather against the others, before any kernel runs: the kernels trust these
    extents (a scale with fewer rows than the weight would be read past its end)."""
    if weight.dim() != 2 or weight.dtype not in TABLE_DTYPES or not weight.is_contiguous():
        raise EngramError(
            f"weight must be a contiguous 2-D table of {', '.join(map(str, TABLE_DTYPES))}; got {describe(weight)}"
        )
    rows, dim = weight.shape
    if ids.dtype not in ID_DTYPES:
        raise EngramError(f"ids must be int64 or int32 row ids; got {describe(ids)}")
    if not (row_start >= 0 and row_start + rows <= table_rows):
        raise EngramError(
            f"the shard's rows [{row_start}, {row_start + rows}) must lie inside the table's {table_rows} rows"
        )
    if scale is None:
        if weight.dtype == torch.float8_e4m3fn and out_dtype != weight.dtype:
            raise EngramError("fp8 rows need their ue8m0 block scales to be dequantised: pass scale")
        if out_dtype not in TABLE_DTYPES:
            raise EngramError(f"the output dtype must be one of {', '.join(map(str, TABLE_DTYPES))}; got {out_dtype}")
        return
    if weight.dtype != torch.float8_e4m3fn:
        raise EngramError(f"a scale goes with fp8 (float8_e4m3fn) rows only; the weight is {weight.dtype}")
    if dim % SCALE_BLOCK:
        raise EngramError(f"fp8 rows need a dim divisible by {SCALE_BLOCK} (one scale per block); got {dim}")
    expected = (rows, dim // SCALE_BLOCK)
    if scale.dtype != SCALE_DTYPE or tuple(scale.shape) != expected or not scale.is_contiguous():
        raise EngramError(
            f"scale must be a contiguous {SCALE_DTYPE} tensor of shape {list(expected)} (one per block of {SCALE_BLOCK}); got {describe(scale)}"
        )
    if scale.device != weight.device:
        raise EngramError(f"scale and weight must be on one device; got {scale.device} and {weight.device}")
    if out_dtype not in OUT_KINDS:
        raise EngramError(f"fp8 rows dequantise into {' or '.join(map(str, OUT_KINDS))}; got {out_dtype}")


def check_out(ids: torch.Tensor, dim: int, out: torch.Tensor) -> None:
    shape = (*ids.shape, dim)
    if tuple(out.shape) != shape or not out.is_contiguous() or out.device != ids.device:
        raise EngramError(
            f"out must be a contiguous tensor of shape {list(shape)} on {ids.device}, got {list(out.shape)} on {out.device}"
        )


def check_token_ids(ids: torch.Tensor, vocab: int) -> None:
    """Compressed token ids outside [0, vocab) are an error (they would overflow the hash's multiply bound),
    raised before hashing. A host sync on a GPU, where the CUDA hash flags them instead."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise EngramError(f"compressed id {int(bad)} is outside [0, {vocab}); compress raw token ids first")


@dataclass(frozen=True)
class GatherCall:
    """One gather whose arguments engram.ops.launch.run_gather has checked against each other: what a
    device's kernel launch takes (its kernels trust these extents). `check`: more ids to range-check alike."""

    weight: torch.Tensor
    scale: torch.Tensor | None
    ids: torch.Tensor
    row_start: int
    table_rows: int
    out: torch.Tensor
    dedup: bool
    check: torch.Tensor | None


@dataclass(frozen=True)
class HashCall:
    """One n-gram hash as a device's kernel launch takes it: ext [context + T] (history, then the T new
    token ids, which must lie in [0, vocab)), start [T], multipliers [L, N], primes, magic (Barrett
    constants) and offsets [L, C], the fill id, and out [T, L, C]."""

    ext: torch.Tensor
    start: torch.Tensor
    multipliers: torch.Tensor
    primes: torch.Tensor
    magic: torch.Tensor
    offsets: torch.Tensor
    fill: int
    vocab: int
    out: torch.Tensor
