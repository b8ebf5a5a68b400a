"""Which rows a host tier holds and in which of its slots, for a tier that changes a few rows on every
lookup (the RAM tier): an open-addressing hash table (linear probing, backward-shift deletion) in one
int64 tensor, searched and changed by the native CPU kernels (kernels/cpu/tier_cpu.c) in one pass over a
lookup's ids. Its memory is fixed, about 11.4 B a row at the 0.7 load it is sized for, and a change
rewrites only the entries it changes (sorted arrays of the held rows, as the device tier keeps, would take
25 B a row and be rebuilt as rows change on every lookup). Host memory only."""

from __future__ import annotations

import ctypes

import torch

from engram.errors import EngramError
from engram.ops import cpu

EMPTY = -1  # an empty bucket
FREE = -1  # the slot find gives a row not held
LOAD = 0.7  # entries per bucket at most: a probe for a row not held reads about 6 buckets, one cache line
MAX_ROWS = 1 << 31  # local rows and slots are 31 bits in an entry


def buckets_for(capacity: int) -> int:
    """The table's size for `capacity` rows: over capacity / LOAD, so a probe always ends at an empty one."""
    return int(capacity / LOAD) + 1


def native() -> ctypes.CDLL:
    """The CPU kernels, which keep the index; a RAM tier cannot run without them."""
    library = cpu.cpu_library()
    if library is None:
        raise EngramError(f"a RAM tier (ram_cache_bytes) needs engram's CPU kernels: {cpu.unavailable_reason()}")
    return library


class RowIndex:
    """Rows held -> slots, for at most `capacity` rows of the shard's global rows [start, stop) (module
    docstring)."""

    def __init__(self, capacity: int, rows: tuple[int, int]) -> None:
        if capacity <= 0:
            raise EngramError(f"a tier holds at least one row, not {capacity}")
        if capacity >= MAX_ROWS or rows[1] - rows[0] > MAX_ROWS:
            raise EngramError(
                f"a RAM tier indexes at most {MAX_ROWS:,} rows of a shard of at most as many; this one asks "
                f"{capacity:,} of {rows[1] - rows[0]:,}: shard the table over more ranks"
            )
        self.library = native()
        self.capacity, self.rows = capacity, rows
        self.table = torch.full((buckets_for(capacity),), EMPTY, dtype=torch.int64)
        self.held = 0

    @property
    def nbytes(self) -> int:
        return self.table.numel() * 8

    def _shape(self) -> tuple[int, int, int, int]:
        return self.table.numel(), self.rows[0], self.rows[1] - self.rows[0], self.capacity

    def clear(self) -> None:
        """Hold nothing."""
        self.table.fill_(EMPTY)
        self.held = 0

    def find(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether each of `ids` (int64, any shape, flattened) is held, and its slot (FREE where not)."""
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        slot = torch.empty_like(flat)
        status = self.library.engram_tier_find(
            cpu.ptr(self.table), *self._shape(), cpu.ptr(flat), flat.numel(), cpu.ptr(slot)
        )
        cpu.check(status, "the RAM tier's index (find)")
        return slot != FREE, slot

    def add(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Hold `rows` (distinct, none held, the shard's) in `slots` (distinct, in [0, capacity))."""
        if self.held + rows.numel() > self.capacity:
            raise EngramError(f"the tier's index holds {self.capacity:,} rows; {self.held + rows.numel():,} asked")
        rows, slots = rows.to(torch.int64).contiguous(), slots.to(torch.int64).contiguous()
        status = self.library.engram_tier_insert(
            cpu.ptr(self.table), *self._shape(), cpu.ptr(rows), cpu.ptr(slots), rows.numel()
        )
        cpu.check(status, "the RAM tier's index (add)")
        self.held += rows.numel()

    def remove(self, rows: torch.Tensor) -> None:
        """Let go of `rows` (each held, distinct)."""
        rows = rows.to(torch.int64).contiguous()
        status = self.library.engram_tier_remove(cpu.ptr(self.table), *self._shape(), cpu.ptr(rows), rows.numel())
        cpu.check(status, "the RAM tier's index (remove)")
        self.held -= rows.numel()
