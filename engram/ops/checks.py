"""What every gather and hash is checked against before any kernel runs: dtypes, shapes, devices and the
ranges of ids. The kernels trust these extents (a scale with fewer rows than the weight would be read past
its end), and raise nothing themselves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from engram.errors import EngramError
from engram.memory.outputs import empty_cpu
from engram.ops.formats import FORMATS
from engram.ops.segments import Rows, Segmented

DEAD_ID = -1

SCALE_BLOCK = FORMATS["fp8"].block

OUT_KINDS = {torch.float32: 1, torch.bfloat16: 2}

ID_DTYPES = (torch.int64, torch.int32)

TABLE_DTYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32, torch.uint8)

SCALE_DTYPE = torch.float8_e8m0fnu

# How dequantised rows are stored (kernels/engram_common.h): fp8 with ue8m0 block-32 scales (DeepSeek
# V4.1), fp8 with one float scale per table, NVFP4 (two e2m1 a byte, e4m3 block-16 scales and one float
# scale per table; Qwen4Exp). None: rows are copied (or converted) as stored.
QUANT_FP8_BLOCK32, QUANT_FP8_TABLE, QUANT_NVFP4 = 0, 1, 2
NVFP4_BLOCK = FORMATS["nvfp4"].block


def row_format(weight: Rows, scale: Rows | None, table_scale: float | None) -> tuple[int | None, int]:
    """(quant, values per row) of a table: which dequantisation its rows take, and the output's width."""
    if table_scale is None:
        return (QUANT_FP8_BLOCK32 if scale is not None else None), weight.shape[1]
    if weight.dtype == torch.uint8:
        return QUANT_NVFP4, 2 * weight.shape[1]
    return QUANT_FP8_TABLE, weight.shape[1]


def check_ids(ids: torch.Tensor, table_rows: int) -> None:
    """Ids outside [-1, table_rows) are an error, raised before any row is read (a host sync on a GPU:
    the engine checks once per step instead, see engram.ops.cuda.ErrorFlag)."""
    if ids.numel() == 0:
        return
    bad = ids[(ids < DEAD_ID) | (ids >= table_rows)]
    if bad.numel():
        raise EngramError(f"row id {int(bad[0])} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")


def check_id_dtype(ids: torch.Tensor) -> None:
    """Row ids are int64 or int32: a float id would be truncated to a row, a bool or uint8 one read as another."""
    if ids.dtype not in ID_DTYPES:
        raise EngramError(f"ids must be int64 or int32 row ids; got {describe(ids)}")


def describe(t: Rows) -> str:
    return f"{t.dtype} {list(t.shape)} on {t.device}"


def check_gather_args(call: GatherCall) -> None:
    """Every argument of a gather against the others, before any kernel runs: the kernels trust these
    extents (a scale with fewer rows than the weight would be read past its end)."""
    weight, scale, ids, row_start, table_rows = call.weight, call.scale, call.ids, call.row_start, call.table_rows
    out_dtype, table_scale = call.out_dtype, call.table_scale
    if weight.dim() != 2 or weight.dtype not in TABLE_DTYPES or not weight.is_contiguous():
        raise EngramError(
            f"weight must be a contiguous 2-D table of {', '.join(map(str, TABLE_DTYPES))}; got {describe(weight)}"
        )
    rows, dim = weight.shape
    check_id_dtype(ids)
    if not (row_start >= 0 and row_start + rows <= table_rows):
        raise EngramError(
            f"the shard's rows [{row_start}, {row_start + rows}) must lie inside the table's {table_rows} rows"
        )
    if table_scale is not None:
        _check_table_scaled(weight, scale, out_dtype)
        return
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


def _check_table_scaled(weight: Rows, scale: Rows | None, out_dtype: torch.dtype) -> None:
    """Rows with one float scale per table: fp8 (no per-row scales) or NVFP4 (e4m3 block-16 scales)."""
    rows, width = weight.shape
    if out_dtype not in OUT_KINDS:
        raise EngramError(f"scaled rows dequantise into {' or '.join(map(str, OUT_KINDS))}; got {out_dtype}")
    if weight.dtype == torch.float8_e4m3fn:
        if scale is not None:
            raise EngramError("fp8 rows take ue8m0 block scales or one table scale, not both")
        return
    if weight.dtype != torch.uint8:
        raise EngramError(
            f"a table scale goes with fp8 (float8_e4m3fn) or NVFP4 (uint8, two values a byte) rows; the weight is {weight.dtype}"
        )
    expected = (rows, 2 * width // NVFP4_BLOCK)
    if (2 * width) % NVFP4_BLOCK:
        raise EngramError(f"NVFP4 rows need a dim divisible by {NVFP4_BLOCK}; got {2 * width}")
    if (
        scale is None
        or scale.dtype != torch.float8_e4m3fn
        or tuple(scale.shape) != expected
        or not scale.is_contiguous()
    ):
        got = "none" if scale is None else describe(scale)
        raise EngramError(
            f"NVFP4 rows need a contiguous float8_e4m3fn scale of shape {list(expected)} (one per block of {NVFP4_BLOCK}); got {got}"
        )
    if scale.device != weight.device:
        raise EngramError(f"scale and weight must be on one device; got {scale.device} and {weight.device}")


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


@dataclass(slots=True)
class GatherCall:
    """One gather, every argument named: rows for the global row ids `ids` (int64 or int32, any shape
    [..]) from a shard holding rows [row_start, row_start + len(weight)) of a table of `table_rows` rows.

    - `weight` [rows, width] (a tensor, or Segmented: rows in pieces, read on the CPU), as stored: fp8 (float8_e4m3fn), bf16, fp16, fp32, or NVFP4 (uint8, two e2m1
      values a byte); `scale` its block scales (ue8m0 [rows, dim/32] for fp8, e4m3 [rows, dim/16] for
      NVFP4), None for other formats; `table_scale` the one float scale per table of fp8-table and NVFP4.
    - `out` the output kind: a dtype (a fresh output [.., dim]) or a contiguous buffer [.., dim] the
      caller keeps (its dtype is the output's). Rows stored as one float type and wanted as another are
      converted; scaled rows are dequantised into float32 or bfloat16; without their scales, fp8 rows
      are copied as stored.
    - `sorted` takes the sorted form: each distinct row read once, in address order (engram.ops.ids;
      use_sorted says where it pays). The rows returned are the same, bit for bit.
    - `check` more ids to range-check alike (a head shard's peers read the step's other columns: all
      ranks must agree on an error).

    DEAD_ID (-1) and rows of other shards read +0.0. An id outside [-1, table_rows) is an error: raised
    before any row is read on the CPU, flagged on a GPU (engram.ops.cuda.check_error_flags). Every
    extent is checked against the others before a kernel runs (check_gather_args). The fields' order is
    the ops' argument order: engram.ops.library derives both op schemas from it."""

    weight: Rows
    scale: Rows | None
    ids: torch.Tensor
    row_start: int
    table_rows: int
    out: torch.Tensor | torch.dtype  # engram::gather takes a dtype, engram::gather_into a buffer
    sorted: bool = False
    check: torch.Tensor | None = None
    table_scale: float | None = None

    @property
    def out_dtype(self) -> torch.dtype:
        return self.out.dtype if isinstance(self.out, torch.Tensor) else self.out

    @property
    def quant(self) -> int | None:
        return row_format(self.weight, self.scale, self.table_scale)[0]

    @property
    def dim(self) -> int:
        return row_format(self.weight, self.scale, self.table_scale)[1]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return (*self.ids.shape, self.dim)

    def args(self) -> list[Any]:
        """The op's arguments, in its order."""
        return [getattr(self, name) for name in GATHER_FIELDS]

    def run(self) -> torch.Tensor:
        """The gather, through the torch op (engram::gather, or engram::gather_into for a kept buffer); rows
        in pieces (Segmented: a torch op takes tensors only) through the op's body itself."""
        if isinstance(self.weight, Segmented):
            out = self.out if isinstance(self.out, torch.Tensor) else empty_cpu(self.out_shape, self.out_dtype)
            RUN_DIRECT[0](replace(self, out=out))
            return out
        if isinstance(self.out, torch.Tensor):
            torch.ops.engram.gather_into.default(*self.args())
            return self.out
        return torch.ops.engram.gather.default(*self.args())  # type: ignore[no-any-return]


GATHER_FIELDS = tuple(f.name for f in fields(GatherCall))
# The body of the ops, for a call the ops cannot take (rows in pieces): engram.ops.dispatch's run_gather, put
# here when that module is imported (engram.ops imports it), as the devices' launchers are.
RUN_DIRECT: list[Callable[[GatherCall], None]] = []


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
