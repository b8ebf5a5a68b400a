"""The RAM tier's choice (ClockAdmission), made on every lookup of a file on disk: right after a lookup the
pages of the rows it missed are in the page cache (or were just read past it), so admitting them then
costs a copy, not a disk read, while a window later most of them have been pushed out again. It admits
every row it misses and evicts by CLOCK (a referenced bit per slot, a hand that clears the bits it passes
and reuses the first slot whose bit is clear): on text, recency is what predicts the next lookups of a
row (the same document's n-grams), and its state is a byte a slot. In a replay of bench_ram_tier's
stream (a V4.1-shaped table four times the memory, 14.6% of its rows held) CLOCK hit 52.3% of a step's
distinct rows, an LRU of rows 52.6%, a frequency estimate with sampled victims 49.3% and S3-FIFO 50.2%;
Belady's bound is 71.6%."""

from __future__ import annotations

import ctypes

import torch

from engram.errors import EngramError
from engram.ops import cpu
from engram.runtime.tiers.budget import Policy
from engram.runtime.tiers.choice import Change, owned_rows
from engram.runtime.tiers.row_index import FREE, RowIndex, native

# A RAM tier slot's state (engram_clock_sweep): its bit clear or set, or pinned while a lookup reads it.
CLEAR, SET, PINNED = 0, 1, 2


class ClockAdmission:
    """Which rows of [row_start, row_stop) a RAM tier of `capacity` rows holds, changed after every lookup
    by CLOCK (module docstring): `index` maps the rows held to their slots, `row_of_slot` says what each
    slot holds (int32, the shard's row less row_start; -1 empty) and `referenced` whether its row was looked up since the hand last passed it. A lookup
    pins the rows it hits (begin) and those it admits (take) until it ends (end): the hand passes them,
    so none is evicted before the lookup has read it. Host memory."""

    def __init__(self, capacity: int, rows: tuple[int, int], *, policy: Policy = "online") -> None:
        self.capacity, self.rows, self.policy = capacity, rows, policy
        self.index = RowIndex(capacity, rows)
        self.row_of_slot = torch.full((capacity,), FREE, dtype=torch.int32)  # MAX_ROWS: a shard's rows fit
        self.referenced = torch.zeros(capacity, dtype=torch.uint8)  # CLEAR or SET; PINNED during a lookup
        self.hand = 0  # the next slot the sweep looks at
        self._hits: list[torch.Tensor] | None = None  # the slots pinned by the lookup in progress, if one is
        self._admitted: list[torch.Tensor] = []
        self._pinned = 0

    @property
    def used(self) -> int:
        """Rows held: they fill slots [0, used), since a row evicted hands its slot straight to the next."""
        return self.index.held

    @property
    def nbytes(self) -> int:
        """Bytes of the choice's own state: the index, each slot's row and referenced bit."""
        return self.index.nbytes + self.capacity * 5

    def hits(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id is held."""
        return self.index.find(ids.reshape(-1).to(torch.int64))[0]

    def held_rows(self) -> torch.Tensor:
        """The rows held, ascending."""
        return torch.sort(self.row_of_slot[: self.used]).values.to(torch.int64) + self.rows[0]

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> Change:
        """Hold the first rows of `hot` that are ours, as many as fit (WindowedAdmission.warm), each referenced: a
        profile's row outlives one sweep of the hand unless the traffic never asks for it. `counts` play
        no part: the traffic, not a count, keeps a row."""
        owned, _ = owned_rows(hot, counts, self.rows, self.capacity)
        evicted = self.used
        self.index.clear()
        slots = torch.arange(owned.numel())
        self.index.add(owned, slots)
        self.row_of_slot.fill_(FREE)
        self.row_of_slot[slots] = (owned - self.rows[0]).to(torch.int32)
        self.referenced.fill_(CLEAR)
        self.referenced[slots] = SET
        self.hand = 0
        return Change(owned, slots, evicted)

    def admit(self, ids: torch.Tensor) -> Change:
        """A whole lookup of `ids` at once: its hits marked referenced, and the rows it missed admitted
        (begin, take, end)."""
        flat = torch.unique(ids.reshape(-1).to(device="cpu", dtype=torch.int64))  # a GPU engine's ids: the tier is RAM
        hit, slot = self.index.find(flat)
        self.begin(hit, slot)
        try:
            return self.take(flat[~hit])
        finally:
            self.end()

    def begin(self, hit: torch.Tensor, slot: torch.Tensor) -> None:
        """A lookup starts, which hits the rows `hit` in `slot` (index.find's, for distinct ids): they are
        pinned until it ends."""
        if self._hits is not None:
            raise EngramError("internal: a RAM tier's lookup began before the last one ended")
        self._hits = [slot[hit]]
        self.referenced[self._hits[0]] = PINNED
        self._pinned = self._hits[0].numel()

    def take(self, rows: torch.Tensor) -> Change:
        """Admit rows the lookup in progress missed (not held, distinct, ascending): into free slots while
        there are any, then into the slots the hand sweeps to (engram_clock_sweep), as many as the slots
        not pinned. Rows not ours, and any row of a static tier, are left out. A row comes in pinned, and
        unreferenced once the lookup ends: it stays only if asked for again before the hand comes round."""
        if self._hits is None:
            raise EngramError("internal: a RAM tier admits rows inside a lookup (begin, take, end)")
        if self.policy == "static":
            return Change(rows[:0], rows[:0], 0)
        new = rows[(rows >= self.rows[0]) & (rows < self.rows[1])][: self.capacity - self._pinned]
        take = min(self.capacity - self.used, new.numel())
        free = torch.arange(self.used, self.used + take)
        self.referenced[free] = PINNED
        self._admitted.append(free)  # unpinned by end(), whatever fails below
        victims = torch.empty(new.numel() - take, dtype=torch.int64)
        hand = ctypes.c_int64(self.hand)
        status = native().engram_clock_sweep(
            self.referenced.data_ptr(), self.referenced.numel(), ctypes.byref(hand), victims.numel(), cpu.ptr(victims)
        )
        cpu.check(status, "the RAM tier's sweep")
        self.hand = hand.value
        self._admitted.append(victims)
        self._pinned += new.numel()
        self.index.remove(self.row_of_slot[victims].to(torch.int64) + self.rows[0])
        slots = torch.cat([free, victims])
        self.index.add(new, slots)
        self.row_of_slot[slots] = (new - self.rows[0]).to(torch.int32)
        return Change(new, slots, victims.numel())

    def end(self) -> None:
        """The lookup in progress has read its rows: those it hit are referenced, those it admitted not."""
        for slots, state in ((self._hits or [], SET), (self._admitted, CLEAR)):
            for part in slots:
                self.referenced[part] = state
        self._hits, self._admitted, self._pinned = None, [], 0
