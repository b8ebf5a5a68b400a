"""The torch ops engram::gather, engram::gather_into and engram::ngram_hash, with fake kernels so that
torch.compile traces through them. Each is declared once for every device; its body (engram.ops.launch)
picks the device's kernel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engram.memory.outputs import empty_cpu
from engram.ops.checks import row_format
from engram.ops.launch import run_gather, run_hash


def _gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
    dedup: bool = False,
    check: torch.Tensor | None = None,
    table_scale: float | None = None,
) -> torch.Tensor:
    shape = (*ids.shape, row_format(weight, scale, table_scale)[1])
    out = (
        empty_cpu(shape, out_dtype)
        if ids.device.type == "cpu"
        else torch.empty(shape, dtype=out_dtype, device=ids.device)
    )
    run_gather(weight, scale, ids, row_start, table_rows, out, dedup, check, table_scale)
    return out


def _gather_fake(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
    dedup: bool = False,
    check: torch.Tensor | None = None,
    table_scale: float | None = None,
) -> torch.Tensor:
    return ids.new_empty((*ids.shape, row_format(weight, scale, table_scale)[1]), dtype=out_dtype)


def _no_result(*args: object) -> None:
    """The fake kernel of the ops that only write into a buffer they are given."""
    return None


# The ops are declared with torch.library's low-level API, one Python function per op for every device
# (the launch tables above pick the kernel): torch.library.custom_op adds about 25 us of Python around a
# mutating op's call (its ADInplaceOrView step fills in the schema's defaults each time), more than the
# whole rest of an eager layer call (benchmarks/bench_host_time.py).
OPS: dict[str, tuple[str, Callable[..., Any], Callable[..., Any]]] = {  # name: schema, kernel, fake kernel
    "gather": (
        "(Tensor weight, Tensor? scale, Tensor ids, int row_start, int table_rows, ScalarType out_dtype, "
        "bool dedup=False, Tensor? check=None, float? table_scale=None) -> Tensor",
        _gather,
        _gather_fake,
    ),
    "gather_into": (
        "(Tensor weight, Tensor? scale, Tensor ids, int row_start, int table_rows, Tensor(a!) out, "
        "bool dedup=False, Tensor? check=None, float? table_scale=None) -> ()",
        run_gather,
        _no_result,
    ),
    "ngram_hash": (
        "(Tensor ext, Tensor start, Tensor multipliers, Tensor primes, Tensor magic, Tensor offsets, "
        "int fill, int vocab, Tensor(a!) out) -> ()",
        run_hash,
        _no_result,
    ),
}

_LIBRARY = torch.library.Library("engram", "DEF")  # type: ignore[no-untyped-call]

for _name, (_schema, _kernel, _fake) in OPS.items():
    _LIBRARY.define(_name + _schema)  # type: ignore[no-untyped-call]
    for _key in ("CPU", "CUDA"):
        _LIBRARY.impl(_name, _kernel, _key)  # type: ignore[no-untyped-call]
    torch.library.register_fake(f"engram::{_name}", lib=_LIBRARY)(_fake)

# gather(weight, scale, ids, row_start, table_rows, out_dtype, dedup=False, check=None) -> [.., dim]: rows
# for global row ids `ids` ([..]) from a shard holding rows [row_start, row_start + len(weight)) of a
# table of `table_rows` rows, in out_dtype. DEAD_ID and rows of other shards read zeros. Any device: a
# fresh output, filled by that device's kernel. `dedup` takes the sorted form (each distinct row read
# once, in address order; see use_sorted). `check`: more ids to range-check alike (a head shard's peers
# read the step's other columns: all ranks must agree). `table_scale`: rows with one float scale per
# table, fp8 (weight float8_e4m3fn, no scale) or NVFP4 (weight uint8 [rows, dim/2], scale e4m3 [rows, dim/16]).
gather = torch.ops.engram.gather.default

# gather_into(..., out, dedup=False, check=None): the same into a buffer the caller keeps ([.., dim], its
# dtype the output's): no allocation, no page faults for a fresh output, a static address for CUDA graphs.
gather_into = torch.ops.engram.gather_into.default

# ngram_hash(ext, start, multipliers, primes, magic, offsets, fill, vocab, out): row ids into `out`
# [T, L, C]; `magic` holds the Barrett constants floor((2^64 - 1) / prime). The new tokens (the last T of
# ext) must lie in [0, vocab): the CPU kernel raises, the CUDA one flags (engram.ops.cuda.check_error_flags).
ngram_hash = torch.ops.engram.ngram_hash.default
