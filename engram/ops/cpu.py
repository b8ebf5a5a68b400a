"""The CPU twins of the kernels (kernels/cpu/*.c), built with the system C compiler and called through
the same C ABI as the CUDA kernels. They are the fast CPU path and the reference the GPU is checked
against; engram falls back to plain torch where no C compiler exists."""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

from engram.errors import EngramError
from engram.ops.build import KERNELS, build_library
from engram.ops.checks import DEAD_ID, OUT_KINDS, GatherCall, HashCall, check_ids, check_token_ids
from engram.ops.ids import kernel_ids
from engram.ops.reference import gather_reference, ngram_hash_reference
from engram.ops.segments import Segmented, bases_at
from engram.user_cache import load_library

log = logging.getLogger(__name__)

STATUS_IO = 5  # ENGRAM_ERR_IO: *os_error says more
STATUS = {
    0: "ok",
    1: "invalid argument",
    2: "id outside the table",
    3: "CUDA error",
    4: "a table read faulted: the memory behind the table is gone (a file-backed table's file shrank)",
    5: "a read from the file failed",
}
_I64P = ctypes.POINTER(ctypes.c_int64)
_IP = ctypes.POINTER(ctypes.c_int)
_VP = ctypes.c_void_p
_VPP = ctypes.POINTER(ctypes.c_void_p)
SIGNATURES: dict[str, list[type]] = {
    "engram_ngram_hash_cpu": [
        _I64P, _I64P, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, _I64P, _I64P,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int,
    ],
    "engram_vector_bytes_cpu": [_VP, ctypes.c_int64],
    "engram_readahead_cpu": [
        _VPP, _I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int64,
        ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int64, _I64P, _I64P,
    ],
    "engram_read_direct_cpu": [
        _IP, _I64P, _I64P, _I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, ctypes.c_int64,
        _VP, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, _I64P,
    ],
    "engram_tier_find": [_I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int64, _I64P],
    "engram_tier_insert": [
        _I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, ctypes.c_int64,
    ],
    "engram_tier_remove": [_I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int64],
    "engram_clock_sweep": [_VP, ctypes.c_int64, _I64P, ctypes.c_int64, _I64P],
    "engram_gather_cpu": [
        _VP, _VP, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        _I64P, _I64P, _I64P, ctypes.c_int64, _VP, ctypes.c_int, ctypes.c_int, ctypes.c_float, _I64P, ctypes.c_int,
    ],
    "engram_gather_segments_cpu": [
        _VPP, _VPP, _I64P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_int64, _I64P, _I64P, _I64P, ctypes.c_int64, _VP, ctypes.c_int, ctypes.c_int, ctypes.c_float, _I64P,
        ctypes.c_int,
    ],
}  # fmt: skip


def bind(library: ctypes.CDLL, signatures: dict[str, list[type]]) -> ctypes.CDLL:
    """Declare argument and return types, so ctypes checks every call instead of guessing."""
    for name, argtypes in signatures.items():
        function = getattr(library, name)
        function.argtypes = argtypes
        function.restype = ctypes.c_int
    return library


def check(status: int, what: str) -> None:
    if status != 0:
        raise EngramError(f"{what} failed: {STATUS.get(status, f'status {status}')}")


def cpu_library() -> ctypes.CDLL | None:
    """The CPU twin library, or None (logged once) where it cannot be built: unavailable_reason() says why."""
    return _built()[0]


def unavailable_reason() -> str | None:
    """Why the CPU twins are not available here (what to change), or None when they are."""
    return _built()[1]


FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror"]


@functools.cache
def _built() -> tuple[ctypes.CDLL | None, str | None]:
    if os.environ.get("ENGRAM_NATIVE", "1") == "0":
        return None, "ENGRAM_NATIVE=0 turns them off; unset it"
    sources = sorted((KERNELS / "cpu").glob("*.c"))
    if not sources:  # an install that left the kernel sources behind: no compiler can help
        reason = (
            f"engram's kernel sources are missing from {KERNELS}; reinstall engram from a complete wheel or checkout"
        )
        log.warning("engram: CPU kernels unavailable, using plain torch: %s", reason)
        return None, reason
    try:
        path = build_library("engram_cpu", sources, os.environ.get("CC", "cc"), FLAGS)
        return bind(load_library(path), SIGNATURES), None
    except (EngramError, OSError) as exc:
        log.warning("engram: CPU kernels unavailable, using plain torch: %s", exc)
        return None, f"{str(exc).splitlines()[0]} (a C compiler with OpenMP builds them: install cc, or set CC)"


def ptr(tensor: torch.Tensor) -> ctypes._Pointer[ctypes.c_int64]:
    if not tensor.is_contiguous() or tensor.dtype != torch.int64 or tensor.device.type != "cpu":
        raise EngramError("internal: kernels take contiguous int64 CPU tensors")
    return ctypes.cast(tensor.data_ptr(), _I64P)


# Below this many items a kernel runs on one thread: waking a thread team costs more than it saves, and
# replicas sharing a machine would spin against each other.
PARALLEL_MIN = 16384


def threads_for(items: int) -> int:
    return torch.get_num_threads() if items >= PARALLEL_MIN else 1


def addresses(values: list[int]) -> ctypes.Array[ctypes.c_void_p]:
    """A C array of addresses (a segmented part's pieces)."""
    return (ctypes.c_void_p * len(values))(*values)


def int64s(values: list[int]) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(values))(*values)


def launch_gather(call: GatherCall) -> None:
    """The native CPU kernel, or plain torch where it did not build."""
    weight, scale, ids, table_rows, out = call.weight, call.scale, call.ids, call.table_rows, call.out
    assert isinstance(out, torch.Tensor)
    if call.check is not None:
        check_ids(call.check, table_rows)
    library = cpu_library()
    if library is None:
        out.copy_(gather_reference(call))
        return
    flat, order, leader = kernel_ids(ids, call.sorted)
    bad = ctypes.c_int64(0)
    quant = call.quant
    common = (
        call.dim, weight.shape[1] * weight.element_size(), call.row_start, table_rows, ptr(flat),
        None if order is None else ptr(order), None if leader is None else ptr(leader), flat.numel(),
        out.data_ptr() or None, 0 if quant is None else OUT_KINDS[out.dtype], quant or 0,
        1.0 if call.table_scale is None else call.table_scale, ctypes.byref(bad), threads_for(flat.numel()),
    )  # fmt: skip
    if isinstance(weight, Segmented):
        scales = None if scale is None else addresses(bases_at(scale, weight.starts))
        status = library.engram_gather_segments_cpu(
            addresses(weight.bases()), scales, int64s(list(weight.starts)), len(weight.pieces), weight.shape[0], *common
        )
        what = "engram_gather_segments_cpu"
    else:
        assert not isinstance(scale, Segmented)
        status = library.engram_gather_cpu(
            weight.data_ptr() or None, scale.data_ptr() if scale is not None else None, weight.shape[0], *common
        )
        what = "engram_gather_cpu"
    if status == 2:
        raise EngramError(f"row id {bad.value} is outside the table's {table_rows} rows (DEAD_ID is {DEAD_ID})")
    check(status, what)


def _hash_native(call: HashCall) -> bool:
    library = cpu_library()
    if library is None:
        return False
    layers, max_ngram = call.multipliers.shape
    tokens = call.start.numel()
    status = library.engram_ngram_hash_cpu(
        ptr(call.ext), ptr(call.start), tokens, call.ext.numel() - tokens, ptr(call.multipliers), ptr(call.primes),
        ptr(call.magic), ptr(call.offsets), layers, max_ngram, call.primes.shape[1] // (max_ngram - 1), call.fill,
        ptr(call.out), threads_for(tokens * layers),
    )  # fmt: skip
    check(status, "engram_ngram_hash_cpu")
    return True


def launch_hash(call: HashCall) -> None:
    """The CPU kernel, or plain torch where it did not build; token ids outside the vocabulary raise."""
    check_token_ids(call.ext[call.ext.numel() - call.start.numel() :], call.vocab)
    if not _hash_native(call):
        ngram_hash_reference(call.ext, call.start, call.multipliers, call.primes, call.offsets, call.fill, call.out)
