"""torch custom ops: `engram::gather` (rows of a table shard for global row ids, dequantised) and
`engram::ngram_hash` (n-gram row ids). The CPU kernels are the native twins where they build, else plain
torch; engram.kernels adds the CUDA kernels. Fake kernels let torch.compile trace through the ops."""

from __future__ import annotations

import ctypes

import torch

from engram import native
from engram.errors import EngramError
from engram.runtime.mapping import empty_cpu

DEAD_ID = -1
SCALE_BLOCK = 32
OUT_KINDS = {torch.float32: 1, torch.bfloat16: 2}
# Below this many items a kernel runs on one thread: waking a thread team costs more than it saves, and
# replicas sharing a machine would spin against each other.
PARALLEL_MIN = 16384


def threads_for(items: int) -> int:
    return torch.get_num_threads() if items >= PARALLEL_MIN else 1


def ensure_kernels(device: torch.device) -> None:
    """Register the CUDA kernels before the first op on a GPU (importing engram.kernels does it)."""
    if device.type == "cuda":
        import engram.kernels  # noqa: F401


def check_ids(ids: torch.Tensor, table_rows: int) -> None:
    """Ids outside [-1, table_rows) are an error, raised before any row is read."""
    if ids.numel() == 0:
        return
    bad = ids[(ids < DEAD_ID) | (ids >= table_rows)]
    if bad.numel():
        raise EngramError(f"row id {int(bad[0])} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")


def gather_reference(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The gather in plain torch: what every kernel is tested against, and the fallback."""
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


def _gather_into_native(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
) -> bool:
    """The native CPU kernel into `out`; False where it does not apply (no library, a conversion it lacks)."""
    library = native.cpu_library()
    raw = scale is None and out.dtype == weight.dtype
    if (
        library is None
        or not weight.is_contiguous()
        or not out.is_contiguous()
        or not (raw or (scale is not None and out.dtype in OUT_KINDS))
    ):
        return False
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    bad = ctypes.c_int64(0)
    status = library.engram_gather_cpu(
        weight.data_ptr() or None, scale.contiguous().data_ptr() if scale is not None else None, weight.shape[0], weight.shape[1],
        weight.shape[1] * weight.element_size(), row_start, table_rows, native.ptr(flat), flat.numel(), out.data_ptr() or None,
        0 if raw else OUT_KINDS[out.dtype], ctypes.byref(bad), threads_for(flat.numel()),
    )  # fmt: skip
    if status == 2:
        raise EngramError(f"row id {bad.value} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")
    native.check(status, "engram_gather_cpu")
    return True


def check_out(ids: torch.Tensor, dim: int, out: torch.Tensor) -> None:
    shape = (*ids.shape, dim)
    if tuple(out.shape) != shape or not out.is_contiguous() or out.device != ids.device:
        raise EngramError(
            f"out must be a contiguous tensor of shape {list(shape)} on {ids.device}, got {list(out.shape)} on {out.device}"
        )


@torch.library.custom_op("engram::gather", mutates_args=())
def gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Rows for global row ids `ids` ([..]) from a shard holding rows [row_start, row_start + len(weight))
    of a table of `table_rows` rows: [.., dim] in out_dtype. DEAD_ID and rows of other shards read zeros.
    Any device: a fresh output, filled by engram::gather_into's kernel for that device."""
    shape = (*ids.shape, weight.shape[1])
    out = (
        empty_cpu(shape, out_dtype)
        if ids.device.type == "cpu"
        else torch.empty(shape, dtype=out_dtype, device=ids.device)
    )
    gather_into(weight, scale, ids, row_start, table_rows, out)
    return out


@gather.register_fake
def _(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    return ids.new_empty((*ids.shape, weight.shape[1]), dtype=out_dtype)


@torch.library.custom_op("engram::gather_into", mutates_args=("out",), device_types="cpu")
def gather_into(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
) -> None:
    """engram::gather into a buffer the caller keeps ([.., dim], its dtype the output's): no allocation,
    no page faults for a fresh output, a static address for CUDA graphs. This is the CPU kernel; the
    CUDA one is in engram.kernels."""
    check_out(ids, weight.shape[1], out)
    if not _gather_into_native(weight, scale, ids, row_start, table_rows, out):
        out.copy_(gather_reference(weight, scale, ids, row_start, table_rows, out.dtype))


@gather_into.register_fake
def _(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
) -> None:
    return None


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


@torch.library.custom_op("engram::ngram_hash", mutates_args=("out",), device_types="cpu")
def ngram_hash(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    out: torch.Tensor,
) -> None:
    """Row ids into `out` [T, L, C]; `magic` holds the Barrett constants floor((2^64 - 1) / prime). The
    CPU kernel; the CUDA one is in engram.kernels."""
    if not _ngram_hash_native(ext, start, multipliers, primes, magic, offsets, fill, out):
        ngram_hash_reference(ext, start, multipliers, primes, offsets, fill, out)


@ngram_hash.register_fake
def _(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    out: torch.Tensor,
) -> None:
    return None
