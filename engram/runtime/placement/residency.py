"""A resident-set budget for file-backed tables (file_cache_bytes): the page cache a table's lookups keep
resident stays near a bound, so a table bigger than RAM does not push the serving process, or its
neighbours, out of memory. The footprint is measured, not guessed: mincore over the file mappings, taken
only when the pages the lookups since the last measure could have added might cross the budget. Past
it, the mappings' pages are released (MADV_DONTNEED, then POSIX_FADV_DONTNEED on the file, which drops
what no other process maps) and the next lookups read their rows again. Pages that other processes keep
mapped stay, so a node's replicas sharing one page cache each bound only what they alone hold."""

from __future__ import annotations

import ctypes
import os

import torch

from engram.memory.mapping import PAGE, Mapping, madvise

MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def resident_pages(addr: int, length: int) -> torch.Tensor:
    """Which pages of [addr, addr + length) are in the page cache (one mincore call; `addr` page-aligned),
    as bools; all False where the range is not mapped."""
    vector = torch.zeros((length + PAGE - 1) // PAGE, dtype=torch.uint8)
    if _libc.mincore(ctypes.c_void_p(addr), length, ctypes.c_void_p(vector.data_ptr())) != 0:
        vector.zero_()
    return (vector & 1).bool()


def resident_bytes(mappings: tuple[Mapping, ...]) -> int:
    """Bytes of these mappings whose pages are in the page cache."""
    return sum(int(resident_pages(m.addr, m.length).sum()) for m in mappings) * PAGE


class ResidentBudget:
    """Keeps the page cache of `mappings` near `budget_bytes` across lookups (after_lookup)."""

    def __init__(self, mappings: tuple[Mapping, ...], budget_bytes: int, row_bytes: int) -> None:
        self.mappings = mappings
        self.budget = budget_bytes
        self.page_span = (row_bytes + PAGE - 1) // PAGE + 1  # pages one row can touch, scales alike
        self.resident = resident_bytes(mappings)
        self.unmeasured = 0  # bytes the lookups since the last measure may have brought in
        self.trims = 0
        self.peak = 0  # the most measured after a lookup

    def after_lookup(self, ids: torch.Tensor) -> None:
        self.unmeasured += ids.numel() * self.page_span * PAGE * 2  # weights and scales
        if self.resident + self.unmeasured <= self.budget:
            return
        self.resident, self.unmeasured = resident_bytes(self.mappings), 0
        self.peak = max(self.peak, self.resident)
        if self.resident > self.budget:
            self.release()

    def release(self) -> None:
        """Drop this process's pages of the files, and the page cache's where no one else maps them."""
        for mapping in self.mappings:
            madvise(mapping.addr, mapping.length, MADV_DONTNEED)
            if mapping.path:
                drop_file_cache(mapping.path)
        self.resident = resident_bytes(self.mappings)
        self.trims += 1


def drop_file_cache(path: str | os.PathLike[str]) -> None:
    """POSIX_FADV_DONTNEED on a whole file: its pages that no process maps leave the page cache (written
    back first: a dirty page would stay; a checkpoint's are clean, and then this costs nothing)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
