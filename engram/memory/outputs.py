"""Large CPU outputs, recycled. A fresh output of tens of MB costs a page fault per 4 KiB page on its first
touch (64 MB: 16,384 faults, about 27 ms here, more than the gather that fills it), and glibc returns
every block that large to the kernel when it is freed, so each call faults its output in again. A caller
that drops each output before the next call (a serving loop does) leaves the last one here with no other
holder: the next output that fits in it is that memory again, already faulted in. An output the caller
still holds, or any view of it, is never handed out twice (its Python references and its storage's uses
are counted). Outputs of every size share the kept memory (a prefill chunk's size changes from step to
step): a request no free one fits gets a new output, and the free ones, all smaller, are let go, so what
is kept is about the largest outputs in use at once, never one block per size seen. New outputs ask for
transparent huge pages. Bounded: RECYCLED_BYTES in all."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import torch

from engram.memory.mapping import HUGE_PAGE, MADV_HUGEPAGE, madvise, round_up

MIN_BYTES = 16 * HUGE_PAGE  # below this, faulting in is cheap next to the call
RECYCLED_BYTES = 512 << 20  # outputs kept for reuse, at most, across shapes
_lock = threading.Lock()
_kept: OrderedDict[int, torch.Tensor] = OrderedDict()  # id -> output, least recently used first
_storage_uses = getattr(torch._C, "_storage_Use_Count", None)  # private: without it, nothing is reused


def _free(key: int) -> bool:
    """The output under `key` is held by _kept alone: no Python reference but ours (getrefcount: ours and
    its argument), no C++ holder of the tensor (its own use count), no other tensor on its storage (a
    lone tensor's storage counts 2 uses)."""
    if _storage_uses is None or not hasattr(_kept[key], "_use_count"):
        return False
    return (
        sys.getrefcount(_kept[key]) <= 2
        and _kept[key]._use_count() == 1  # type: ignore[attr-defined]
        and _storage_uses(_kept[key].untyped_storage()._cdata) <= 2
    )


def empty_cpu(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.empty on the CPU; a large one lies in the smallest free kept output it fits in, else in a new
    one that asks for transparent huge pages before its first touch (best effort)."""
    size = dtype.itemsize
    for dim in shape:
        size *= dim
    if size < MIN_BYTES:
        return torch.empty(shape, dtype=dtype)
    with _lock:
        free = [key for key in _kept if _free(key)]
        fits = [key for key in free if _bytes(_kept[key]) >= size]
        if fits:
            key = min(fits, key=lambda k: _bytes(_kept[k]))
            _kept.move_to_end(key)
            strides: list[int] = []
            step = 1
            for dim in reversed(shape):
                strides.insert(0, step)
                step *= dim
            return torch.empty(0, dtype=dtype).set_(_kept[key].untyped_storage(), 0, shape, strides)
        for key in free:  # each smaller than this request: the new output serves their sizes from now on
            del _kept[key]
        out = torch.empty(shape, dtype=dtype)
        start = round_up(out.data_ptr(), HUGE_PAGE)
        stop = (out.data_ptr() + size) // HUGE_PAGE * HUGE_PAGE
        if stop > start:
            madvise(start, stop - start, MADV_HUGEPAGE)
        _kept[id(out)] = out
        total = sum(_bytes(t) for t in _kept.values())
        while total > RECYCLED_BYTES and len(_kept) > 1:
            _, dropped = _kept.popitem(last=False)
            total -= _bytes(dropped)
        return out


def _bytes(kept: torch.Tensor) -> int:
    return kept.untyped_storage().nbytes()
