"""torch custom ops: `engram::gather` (rows of a table shard for global row ids, dequantised) and
`engram::ngram_hash` (n-gram row ids). The CPU kernels are the native twins where they build, else plain
torch; engram.kernels adds the CUDA kernels. Fake kernels let torch.compile trace through the ops."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import torch

from engram import native
from engram.errors import EngramError
from engram.memory.mapping import empty_cpu

DEAD_ID = -1
SCALE_BLOCK = 32
OUT_KINDS = {torch.float32: 1, torch.bfloat16: 2}
# Below this many items a kernel runs on one thread: waking a thread team costs more than it saves, and
# replicas sharing a machine would spin against each other.
PARALLEL_MIN = 16384


def threads_for(items: int) -> int:
    return torch.get_num_threads() if items >= PARALLEL_MIN else 1


ID_DTYPES = (torch.int64, torch.int32)
TABLE_DTYPES = (torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32, torch.uint8)
SCALE_DTYPE = torch.float8_e8m0fnu


def check_ids(ids: torch.Tensor, table_rows: int) -> None:
    """Ids outside [-1, table_rows) are an error, raised before any row is read (a host sync on a GPU:
    the engine checks once per step instead, see engram.kernels.ErrorFlag)."""
    if ids.numel() == 0:
        return
    bad = ids[(ids < DEAD_ID) | (ids >= table_rows)]
    if bad.numel():
        raise EngramError(f"row id {int(bad[0])} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")


def _describe(t: torch.Tensor) -> str:
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
            f"weight must be a contiguous 2-D table of {', '.join(map(str, TABLE_DTYPES))}; got {_describe(weight)}"
        )
    rows, dim = weight.shape
    if ids.dtype not in ID_DTYPES:
        raise EngramError(f"ids must be int64 or int32 row ids; got {_describe(ids)}")
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
            f"scale must be a contiguous {SCALE_DTYPE} tensor of shape {list(expected)} (one per block of {SCALE_BLOCK}); got {_describe(scale)}"
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


# When the sorted form pays, in lookups per call (None: never). The GPU's translation of scattered host
# addresses, not PCIe, limits random reads of host tables: on the H200 (issue 11) 1M uniform V4.1 lookups
# ran at 7.1 GB/s plain and 41 GB/s sorted from an 8 GiB pinned table (4.9 and 22 from 32 GiB), and even
# a 1 GiB table gained 2x. The floor below which the sort's extra launches cost more than they save is
# provisional until scripts/gpu_check.py's decode and prefill rows are measured: set from its table.
# Device tables read at 0.87x a D2D copy already, and on the CPU the sort did not pay (bench_lookup.py,
# 2 cores, 4 GiB fp8 table: 0.87-1.08x the plain gather, uniform and real-text ids).
SORT_MIN_LOOKUPS = {"uva": 4096, "device": None, "cpu": None}


def use_sorted(lookups: int, weight: torch.Tensor, device: torch.device) -> bool:
    """Whether a gather of `lookups` rows of `weight` on `device` should take the sorted form."""
    where = "cpu" if device.type == "cpu" else "uva" if weight.device.type == "cpu" else "device"
    floor = SORT_MIN_LOOKUPS[where]
    return floor is not None and lookups >= floor


def sort_ids(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sorted form of a gather's ids ([n] int64), in static shapes (capturable, no host sync): ids
    ascending, the order that sorted them, and for each position the first index of its run of equals."""
    ordered, order = torch.sort(ids)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    index = torch.arange(ids.numel(), device=ids.device)
    leader = torch.where(first, index, 0).cummax(0).values
    return ordered, order, leader


def kernel_ids(ids: torch.Tensor, dedup: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The ids as every kernel takes them: flat contiguous int64, and sorted (with order and leader)
    when `dedup` asks for the sorted form."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if dedup and flat.numel():
        return sort_ids(flat)
    return flat, None, None


def gather_reference(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The gather in plain torch: what every kernel is tested against, and the fallback."""
    check_gather_args(weight, scale, ids, row_start, table_rows, out_dtype)
    check_ids(ids, table_rows)
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
    values[~owned] = 0
    return values.view(*ids.shape, weight.shape[1])


Launch = Callable[
    [torch.Tensor, "torch.Tensor | None", torch.Tensor, int, int, torch.Tensor, bool, "torch.Tensor | None"], None
]
# The kernel launch per device type (arguments already checked): the CPU twin here; engram.kernels adds
# "cuda" when it is imported (engram.devices.ensure_kernels), so this layer never imports the CUDA side.
LAUNCHERS: dict[str, Launch] = {}


def run_gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
    dedup: bool = False,
    check: torch.Tensor | None = None,
) -> None:
    """The one body of engram::gather and engram::gather_into on every device: check every argument,
    then launch the device's kernel. A dtype conversion the kernels do not make (rows stored as one float
    type, wanted as another) becomes a raw gather and a torch copy, so no path ever reinterprets bytes."""
    launch = LAUNCHERS.get(ids.device.type)
    if launch is None:
        raise EngramError(
            f"no engram gather kernel for {ids.device.type} tensors (import engram.kernels for CUDA); put the ids on the CPU or a GPU"
        )
    if ids.device.type == "cpu":
        for name, t in (("weight", weight), ("scale", scale), ("out", out)):
            if t is not None and t.device.type != "cpu":
                raise EngramError(f"ids are on the CPU but {name} is on {t.device}: put them on one device")
    check_gather_args(weight, scale, ids, row_start, table_rows, out.dtype)
    check_out(ids, weight.shape[1], out)
    if check is not None and (check.dtype not in ID_DTYPES or check.device != ids.device):
        raise EngramError(f"check must hold int64 or int32 row ids on {ids.device}; got {_describe(check)}")
    if scale is None and out.dtype != weight.dtype:
        raw = torch.empty(out.shape, dtype=weight.dtype, device=out.device)
        launch(weight, None, ids, row_start, table_rows, raw, dedup, check)
        out.copy_(raw)
    else:
        launch(weight, scale, ids, row_start, table_rows, out, dedup, check)


def _launch_cpu(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
    dedup: bool,
    check: torch.Tensor | None,
) -> None:
    """The native CPU kernel, or plain torch where it did not build."""
    if check is not None:
        check_ids(check, table_rows)
    library = native.cpu_library()
    if library is None:
        out.copy_(gather_reference(weight, scale, ids, row_start, table_rows, out.dtype))
        return
    flat, order, leader = kernel_ids(ids, dedup)
    bad = ctypes.c_int64(0)
    status = library.engram_gather_cpu(
        weight.data_ptr() or None, scale.data_ptr() if scale is not None else None, weight.shape[0], weight.shape[1],
        weight.shape[1] * weight.element_size(), row_start, table_rows, native.ptr(flat),
        None if order is None else native.ptr(order), None if leader is None else native.ptr(leader), flat.numel(),
        out.data_ptr() or None, 0 if scale is None else OUT_KINDS[out.dtype], ctypes.byref(bad), threads_for(flat.numel()),
    )  # fmt: skip
    if status == 2:
        raise EngramError(f"row id {bad.value} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")
    native.check(status, "engram_gather_cpu")


LAUNCHERS["cpu"] = _launch_cpu


def _gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
    dedup: bool = False,
    check: torch.Tensor | None = None,
) -> torch.Tensor:
    shape = (*ids.shape, weight.shape[1])
    out = (
        empty_cpu(shape, out_dtype)
        if ids.device.type == "cpu"
        else torch.empty(shape, dtype=out_dtype, device=ids.device)
    )
    run_gather(weight, scale, ids, row_start, table_rows, out, dedup, check)
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
) -> torch.Tensor:
    return ids.new_empty((*ids.shape, weight.shape[1]), dtype=out_dtype)


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


def _ngram_hash_native(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    out: torch.Tensor,
) -> bool:
    library = native.cpu_library()
    if library is None:
        return False
    layers, max_ngram = multipliers.shape
    status = library.engram_ngram_hash_cpu(
        native.ptr(ext), native.ptr(start), start.numel(), ext.numel() - start.numel(), native.ptr(multipliers),
        native.ptr(primes), native.ptr(magic), native.ptr(offsets), layers, max_ngram, primes.shape[1] // (max_ngram - 1),
        fill, native.ptr(out), threads_for(start.numel() * layers),
    )  # fmt: skip
    native.check(status, "engram_ngram_hash_cpu")
    return True


def check_token_ids(ids: torch.Tensor, vocab: int) -> None:
    """Compressed token ids outside [0, vocab) are an error (they would overflow the hash's multiply bound),
    raised before hashing. A host sync on a GPU, where the CUDA hash flags them instead."""
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise EngramError(f"compressed id {int(bad)} is outside [0, {vocab}); compress raw token ids first")


def _ngram_hash(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    vocab: int,
    out: torch.Tensor,
) -> None:
    launch = HASHERS.get(ext.device.type)
    if launch is None:
        raise EngramError(f"no engram hash kernel for {ext.device.type} tensors (import engram.kernels for CUDA)")
    launch(ext, start, multipliers, primes, magic, offsets, fill, vocab, out)


def _hash_cpu(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    vocab: int,
    out: torch.Tensor,
) -> None:
    """The CPU kernel, or plain torch where it did not build; token ids outside the vocabulary raise."""
    check_token_ids(ext[ext.numel() - start.numel() :], vocab)
    if not _ngram_hash_native(ext, start, multipliers, primes, magic, offsets, fill, out):
        ngram_hash_reference(ext, start, multipliers, primes, offsets, fill, out)


HashLaunch = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, torch.Tensor], None
]
HASHERS: dict[str, HashLaunch] = {"cpu": _hash_cpu}  # engram.kernels adds "cuda"


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
        "bool dedup=False, Tensor? check=None) -> Tensor",
        _gather,
        _gather_fake,
    ),
    "gather_into": (
        "(Tensor weight, Tensor? scale, Tensor ids, int row_start, int table_rows, Tensor(a!) out, "
        "bool dedup=False, Tensor? check=None) -> ()",
        run_gather,
        _no_result,
    ),
    "ngram_hash": (
        "(Tensor ext, Tensor start, Tensor multipliers, Tensor primes, Tensor magic, Tensor offsets, "
        "int fill, int vocab, Tensor(a!) out) -> ()",
        _ngram_hash,
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
# read the step's other columns: all ranks must agree).
gather = torch.ops.engram.gather.default
# gather_into(..., out, dedup=False, check=None): the same into a buffer the caller keeps ([.., dim], its
# dtype the output's): no allocation, no page faults for a fresh output, a static address for CUDA graphs.
gather_into = torch.ops.engram.gather_into.default
# ngram_hash(ext, start, multipliers, primes, magic, offsets, fill, vocab, out): row ids into `out`
# [T, L, C]; `magic` holds the Barrett constants floor((2^64 - 1) / prime). The new tokens (the last T of
# ext) must lie in [0, vocab): the CPU kernel raises, the CUDA one flags (engram.kernels.check_error_flags).
ngram_hash = torch.ops.engram.ngram_hash.default
