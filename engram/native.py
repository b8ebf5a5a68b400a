"""The CPU twins of the kernels (kernels/cpu/*.c), built with the system C compiler and called through
the same C ABI as the CUDA kernels. They are the fast CPU path and the reference the GPU is checked
against; engram falls back to plain torch where no C compiler exists."""

from __future__ import annotations

import ctypes
import functools
import logging
import os

import torch

from engram._build import KERNELS, build_library
from engram.errors import EngramError

log = logging.getLogger(__name__)

STATUS = {
    0: "ok",
    1: "invalid argument",
    2: "id outside the table",
    3: "CUDA error",
    4: "a table read faulted: the memory behind the table is gone (a file-backed table's file shrank)",
}
_I64P = ctypes.POINTER(ctypes.c_int64)
_VP = ctypes.c_void_p
SIGNATURES: dict[str, list[type]] = {
    "engram_ngram_hash_cpu": [
        _I64P, _I64P, ctypes.c_int64, ctypes.c_int64, _I64P, _I64P, _I64P, _I64P,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int,
    ],
    "engram_vector_bytes_cpu": [_VP, ctypes.c_int64],
    "engram_readahead_cpu": [_VP, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, _I64P, ctypes.c_int64],
    "engram_gather_cpu": [
        _VP, _VP, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        _I64P, _I64P, _I64P, ctypes.c_int64, _VP, ctypes.c_int, _I64P, ctypes.c_int,
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


@functools.cache
def cpu_library() -> ctypes.CDLL | None:
    """The CPU twin library, or None (logged once) where it cannot be built."""
    if os.environ.get("ENGRAM_NATIVE", "1") == "0":
        return None
    sources = sorted((KERNELS / "cpu").glob("*.c"))
    flags = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror"]
    try:
        path = build_library("engram_cpu", sources, os.environ.get("CC", "cc"), flags)
        return bind(ctypes.CDLL(str(path)), SIGNATURES)
    except (EngramError, OSError) as exc:
        log.warning("engram: CPU kernels unavailable, using plain torch: %s", exc)
        return None


def ptr(tensor: torch.Tensor) -> ctypes._Pointer[ctypes.c_int64]:
    if not tensor.is_contiguous() or tensor.dtype != torch.int64 or tensor.device.type != "cpu":
        raise EngramError("internal: kernels take contiguous int64 CPU tensors")
    return ctypes.cast(tensor.data_ptr(), _I64P)
