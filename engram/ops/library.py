"""The torch ops engram::gather, engram::gather_into and engram::ngram_hash, with fake kernels so that
torch.compile traces through them. Each is declared once for every device; its body (engram.ops.dispatch)
picks the device's kernel."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import torch

from engram.memory.outputs import empty_cpu
from engram.ops.checks import GatherCall
from engram.ops.dispatch import run_gather, run_hash


def _gather(*args: Any) -> torch.Tensor:
    call = GatherCall(*args)
    shape, dtype, device = call.out_shape, call.out_dtype, call.ids.device
    out = empty_cpu(shape, dtype) if device.type == "cpu" else torch.empty(shape, dtype=dtype, device=device)
    call.out = out
    run_gather(call)
    return out


def _gather_into(*args: Any) -> None:
    run_gather(GatherCall(*args))


def _gather_fake(*args: Any) -> torch.Tensor:
    call = GatherCall(*args)
    return call.ids.new_empty(call.out_shape, dtype=call.out_dtype)


# GatherCall's field annotations as the op schema's types
SCHEMA_TYPES = {
    "torch.Tensor": "Tensor",
    "torch.Tensor | None": "Tensor?",
    "Rows": "Tensor",  # the ops take tensors; rows in pieces (Segmented) never reach them (GatherCall.run)
    "Rows | None": "Tensor?",
    "int": "int",
    "bool": "bool",
    "float | None": "float?",
}


def _gather_schema(out: str, returns: str) -> str:
    """An op schema from GatherCall's fields, in their order: `out` the output argument's declaration."""
    declared = []
    for f in fields(GatherCall):
        default = "" if f.default is MISSING else f"={f.default}"
        declared.append(out if f.name == "out" else f"{SCHEMA_TYPES[str(f.type)]} {f.name}{default}")
    return f"({', '.join(declared)}) -> {returns}"


def _no_result(*args: object) -> None:
    """The fake kernel of the ops that only write into a buffer they are given."""
    return None


# The ops are declared with torch.library's low-level API, one Python function per op for every device
# (the launch tables above pick the kernel): torch.library.custom_op adds about 25 us of Python around a
# mutating op's call (its ADInplaceOrView step fills in the schema's defaults each time), more than the
# whole rest of an eager layer call (benchmarks/bench_host_time.py).
OPS: dict[str, tuple[str, Callable[..., Any], Callable[..., Any]]] = {  # name: schema, kernel, fake kernel
    "gather": (_gather_schema("ScalarType out_dtype", "Tensor"), _gather, _gather_fake),
    "gather_into": (_gather_schema("Tensor(a!) out", "()"), _gather_into, _no_result),
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

# The ops in torch's positional form, GatherCall's fields in order (torch.compile traces them). Inside
# engram a gather is built as a GatherCall and run (GatherCall.run); its docstring is the ops' contract.
gather = torch.ops.engram.gather.default
gather.__doc__ = (
    "engram.ops.gather(weight, scale, ids, row_start, table_rows, out_dtype, sorted=False, check=None, "
    "table_scale=None) -> Tensor [*ids.shape, dim]: a fresh output in out_dtype.\n\n" + (GatherCall.__doc__ or "")
)

gather_into = torch.ops.engram.gather_into.default
gather_into.__doc__ = (
    "engram.ops.gather_into(weight, scale, ids, row_start, table_rows, out, sorted=False, check=None, "
    "table_scale=None): the same into a buffer the caller keeps (its dtype the output's): no allocation, no "
    "page faults for a fresh output, a static address for CUDA graphs.\n\n" + (GatherCall.__doc__ or "")
)

# ngram_hash(ext, start, multipliers, primes, magic, offsets, fill, vocab, out): row ids into `out`
# [T, L, C]; `magic` holds the Barrett constants floor((2^64 - 1) / prime). The new tokens (the last T of
# ext) must lie in [0, vocab): the CPU kernel raises, the CUDA one flags (engram.ops.cuda.check_error_flags).
ngram_hash = torch.ops.engram.ngram_hash.default
