"""Tiers of hot rows that learn from the traffic: which rows of a shard a faster memory holds (device
memory over a host table, private RAM over a file-backed one), chosen from the ids actually served.

Every lookup appends its ids to a ring on the tier's device (one index_copy_, static shapes, capturable:
a CUDA graph replay records its ids too). Between steps, once a window of ids has been served, `refresh`
counts the window into a FrequencySketch (a count-min sketch halved every `half_life` windows, so old
traffic fades) and keeps the `capacity` rows of highest estimate among those held and those just seen,
a held row winning a tie (LFU with decay, as TinyLFU admits: a newcomer must beat the row it evicts).
Newly admitted rows are copied into the slots of the evicted ones; the sorted ids and their slots are
rewritten in place, so the mapping from row to slot stays one device tensor whose address a captured
graph keeps. A refresh reads one count back to the host; it runs between steps and never inside a
capture, and the lookups themselves never wait for it.

The frequency estimate sees every order of n-gram alike, and that is enough: bigram rows are looked up
far more often than 3- or 4-gram rows, so they win the slots without a rule of their own, and the long
tail of higher-order rows seen once never evicts a row seen twice. A profile (`engram profile --out`)
is an optional warm start; with policy "static" its rows are all the tier ever holds.

Admission (the choice, ids only) is shared by Tier and by `engram profile`'s replay of a user's text,
so the hit rates it reports are those this code serves."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from engram.errors import EngramError
from engram.runtime.cache import COUNTS, EMPTY_KEY, HotRows, find, stored_rows
from engram.runtime.placement.filemap import files_named_on_fault, read_ahead, resident_rows
from engram.runtime.placement.storage import TableShard
from engram.runtime.sketch import DEPTH, FrequencySketch, sketch_width

Policy = Literal["online", "static"]
POLICIES: tuple[Policy, ...] = ("online", "static")
TierName = Literal["device", "ram"]
WINDOW_IDS = 1 << 17  # ids served between refreshes: about 4k tokens of a table looked up at 32 columns
HALF_LIFE = 32  # windows between halvings of the sketch: about 128k tokens
MAX_SKETCH_WIDTH = 1 << 22  # 64 MiB of counters at most, per table


def width_for(capacity: int, window_ids: int, table_rows: int) -> int:
    """The sketch's width for a tier: room for the rows it holds and a window's ids, never more than the
    rows it can be asked about."""
    return min(MAX_SKETCH_WIDTH, sketch_width(min(table_rows, capacity + window_ids)))


def capacity_for(
    budget_bytes: int, row_bytes: int, table_rows: int, window_ids: int = WINDOW_IDS, policy: Policy = "online"
) -> int:
    """The most rows (of a shard of `table_rows`) a tier of `budget_bytes` holds, its own state counted:
    each row's bytes and its id and slot (16 bytes), and online the ring of a window's ids (16 bytes
    each) and the sketch."""
    per_row = row_bytes + 16

    def needs(rows: int) -> int:
        if policy != "online":
            return rows * per_row
        return rows * per_row + window_ids * 16 + DEPTH * 4 * width_for(rows, window_ids, table_rows)

    low, high = 0, min(table_rows, max(0, budget_bytes) // per_row)  # needs(low) fits; the answer in [low, high]
    if needs(low) > budget_bytes:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if needs(middle) <= budget_bytes else (low, middle - 1)
    return low


@dataclass
class Change:
    """What one refresh did: the rows admitted and the slots they go to; how many rows it evicted."""

    admitted: torch.Tensor
    slots: torch.Tensor
    evicted: int


class Admission:
    """Which rows of [row_start, row_stop) a tier of `capacity` rows holds: `keys` ascending (EMPTY_KEY
    past `used`) and `slots` their slots (a permutation of range(capacity), free slots last), both
    updated in place."""

    def __init__(
        self,
        capacity: int,
        rows: tuple[int, int],
        device: torch.device | str = "cpu",
        *,
        policy: Policy = "online",
        half_life: int = HALF_LIFE,
        window_ids: int = WINDOW_IDS,
        min_count: int = 1,
    ) -> None:
        """`min_count`: the estimate a row not held needs to be admitted at all (a second sighting, for a
        tier whose admissions read the disk)."""
        if capacity <= 0:
            raise EngramError(f"a tier holds at least one row, not {capacity}")
        self.capacity, self.rows, self.policy, self.min_count = capacity, rows, policy, min_count
        self.keys = torch.full((capacity,), EMPTY_KEY, dtype=torch.int64, device=device)
        self.slots = torch.arange(capacity, dtype=torch.int64, device=device)
        self.used = 0
        width = width_for(capacity, window_ids, rows[1] - rows[0])
        self.sketch = FrequencySketch(width, device, half_life=half_life) if policy == "online" else None

    @property
    def nbytes(self) -> int:
        """Bytes of the choice's own state: ids, slots and the sketch."""
        sketch = 0 if self.sketch is None else self.sketch.nbytes
        return self.keys.numel() * 16 + sketch

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> Change:
        """Hold the first rows of `hot` (global ids, most frequent first: a profile's) that are ours, as
        many as fit; rows held before are let go. `counts`: how often the profile saw each, counted into
        the sketch, so the traffic's rows must beat the profile's counts (decaying as any other) to evict
        them, the profile's coldest first."""
        if hot.dtype != torch.int64 or hot.dim() != 1:
            raise EngramError(f"a profile's hot rows are a 1-D int64 tensor; got {hot.dtype} {list(hot.shape)}")
        if counts is not None and counts.shape != hot.shape:
            raise EngramError(f"a profile's counts are one per hot row: {list(counts.shape)} for {hot.numel()} rows")
        hot = hot.to(self.keys.device)
        mine = (hot >= self.rows[0]) & (hot < self.rows[1])
        owned = hot[mine][: self.capacity]
        if torch.unique(owned).numel() != owned.numel():
            raise EngramError("the profile lists a row twice; write it again with `engram profile --out`")
        if counts is not None and self.sketch is not None:
            self.sketch.add(owned, counts.to(self.keys.device)[mine][: self.capacity])
        evicted = self.used
        slots = torch.arange(self.capacity, device=self.slots.device)
        self._set(owned[:0], slots[:0], owned, slots[: owned.numel()], slots[owned.numel() :])
        return Change(owned, slots[: owned.numel()], evicted)

    def refresh(self, window: torch.Tensor, admissible: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Change:
        """Count the ids `window` served and keep the `capacity` rows of highest estimate among those held
        and those in the window (module docstring); a static tier changes nothing. `admissible`: which of
        the rows not held may be admitted now (a mask; the others are counted and wait for a later one)."""
        if self.sketch is None:
            return Change(window[:0], self.slots[:0], 0)
        window = window.reshape(-1).to(torch.int64)
        window = window[(window >= self.rows[0]) & (window < self.rows[1])]
        self.sketch.add(window)
        held, held_slots = self.keys[: self.used], self.slots[: self.used]
        seen = torch.unique(window)
        _, known = find(self.keys, seen)
        new = seen[~known]
        if self.min_count > 1:
            new = new[self.sketch.estimate(new) >= self.min_count]
        if admissible is not None and new.numel():
            new = new[admissible(new)]
        if self.used + new.numel() <= self.capacity:  # room for all: nothing competes
            slots = self.slots[self.used : self.used + new.numel()].clone()
            free = self.slots[self.used + new.numel() :].clone()
            self._set(held.clone(), held_slots.clone(), new, slots, free)
            return Change(new, slots, 0)
        score = torch.cat([self.sketch.estimate(held).long() * 2 + 1, self.sketch.estimate(new).long() * 2])
        top = torch.topk(score, min(self.capacity, score.numel()), sorted=False).indices
        keep = torch.zeros(self.used, dtype=torch.bool, device=held.device)
        keep[top[top < self.used]] = True
        admitted = new[top[top >= self.used] - self.used]
        free = torch.cat([held_slots[~keep], self.slots[self.used :]])
        slots = free[: admitted.numel()]
        evicted = self.used - int(keep.sum())
        self._set(held[keep], held_slots[keep], admitted, slots, free[admitted.numel() :])
        return Change(admitted, slots, evicted)

    def _set(
        self, kept: torch.Tensor, kept_slots: torch.Tensor, added: torch.Tensor, slots: torch.Tensor, free: torch.Tensor
    ) -> None:
        """Hold `kept` (ascending, in `kept_slots`) and `added` (any order, in `slots`), `free` the rest:
        keys and slots rewritten in place, sorted by id. The two are merged, not sorted again: a refresh
        admits few rows beside the many it keeps."""
        order = torch.argsort(added)
        added, slots = added[order], slots[order]
        count = kept.numel() + added.numel()
        device = self.keys.device
        at_kept = torch.searchsorted(added, kept) + torch.arange(kept.numel(), device=device)
        at_added = torch.searchsorted(kept, added) + torch.arange(added.numel(), device=device)
        ids, new_slots = torch.empty(count, dtype=torch.int64, device=device), torch.empty_like(self.slots[:count])
        ids[at_kept], ids[at_added] = kept, added
        new_slots[at_kept], new_slots[at_added] = kept_slots, slots
        self.keys[:count] = ids
        self.keys[count:] = EMPTY_KEY
        self.slots[:count] = new_slots
        self.slots[count:] = free
        self.used = count

    def hits(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id is held (a lookup's hits)."""
        return find(self.keys, ids.reshape(-1).to(torch.int64))[1]


@dataclass(frozen=True)
class TierStats:
    """What a tier holds and what its lookups and refreshes did. Hits + misses = lookups (ids looked up
    while it served, DEAD_ID and other shards' ids among the misses); bytes count rows as stored."""

    tier: TierName
    policy: Policy
    capacity_rows: int
    rows: int  # held now
    bytes: int  # its memory: the rows' slots, their ids and slots, the sketch
    lookups: int
    hits: int
    misses: int
    refreshes: int
    admissions: int
    evictions: int
    bytes_admitted: int  # copied into the tier from the table
    bytes_hit: int  # read from the tier
    bytes_missed: int  # read from the table below it, for misses of rows the shard owns


class Tier:
    """Hot rows of one shard in `device` memory (module docstring)."""

    def __init__(
        self,
        shard: TableShard,
        capacity: int,
        device: torch.device | str,
        name: TierName,
        *,
        policy: Policy = "online",
        window_ids: int = WINDOW_IDS,
        half_life: int = HALF_LIFE,
    ) -> None:
        self.shard, self.name, self.device = shard, name, torch.device(device)
        # A file on disk costs a read per admitted row: admit a row only once it was seen twice.
        self.admission = Admission(
            capacity, (shard.row_start, shard.row_stop), device, policy=policy, half_life=half_life,
            window_ids=window_ids, min_count=2 if shard.readahead else 1,
        )  # fmt: skip
        weight = torch.zeros(capacity, *shard.weight.shape[1:], dtype=shard.weight.dtype, device=device)
        scale = None
        if shard.scale is not None:
            scale = torch.zeros(capacity, *shard.scale.shape[1:], dtype=shard.scale.dtype, device=device)
        self.rows = HotRows(self.admission.keys, weight, scale, self.admission.slots)
        self.counts = torch.zeros(COUNTS, dtype=torch.int64, device=device)
        self.window_ids = window_ids
        self._ring = torch.zeros(window_ids if policy == "online" else 0, dtype=torch.int64, device=device)
        self._steps = torch.arange(self._ring.numel(), dtype=torch.int64, device=device)
        self._served = torch.zeros((), dtype=torch.int64, device=device)  # ids appended since the last refresh
        self.since = 0  # ids the host saw looked up since the last refresh (graph replays not among them)
        self.refreshes = self.admissions = self.evictions = 0

    @property
    def capacity(self) -> int:
        return self.admission.capacity

    @property
    def policy(self) -> Policy:
        return self.admission.policy

    @property
    def due(self) -> bool:
        """Whether a window of ids was served since the last refresh (as far as the host saw)."""
        return self.policy == "online" and self.since >= self.window_ids

    def record(self, ids: torch.Tensor) -> None:
        """Append a lookup's ids to the ring (the latest window_ids of them if more): device ops only."""
        if not self._ring.numel():
            return
        flat = ids.reshape(-1)[-self._ring.numel() :].to(device=self.device, dtype=torch.int64)
        at = (self._served + self._steps[: flat.numel()]) % self._ring.numel()
        self._ring.index_copy_(0, at, flat)
        self._served += flat.numel()
        self.since += ids.numel()

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> int:
        """Start from a profile's hot rows (most frequent first) and their counts; the rows held."""
        self._move(self.admission.warm(hot, counts))
        return self.admission.used

    def refresh(self) -> int:
        """Admit the hottest rows of the latest window (module docstring); the rows admitted. Call it
        between steps, never while a CUDA stream captures."""
        if self.policy != "online":
            return 0
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise EngramError("a tier refreshes between steps, not while a CUDA graph is being captured")
        served = min(int(self._served), self._ring.numel())  # the one read back to the host
        # A file on disk: admit only rows whose pages are still in the page cache (a miss just read them),
        # so admissions read nothing from the disk; the others wait until a miss reads them again.
        admissible = (lambda new: resident_rows(self.shard, new)) if self.shard.readahead else None
        change = self.admission.refresh(self._ring[:served], admissible)
        self._served.zero_()
        self.since = 0
        self.refreshes += 1
        self._move(change)
        return change.admitted.numel()

    def _move(self, change: Change) -> None:
        """Copy the admitted rows into their slots."""
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        if not change.admitted.numel():
            return
        if self.shard.readahead:  # a file on disk: its rows' pages asked for at once, sorted and coalesced
            read_ahead(self.shard, change.admitted)
        with files_named_on_fault(self.shard):
            for part, mine in ((self.shard.weight, self.rows.weight), (self.shard.scale, self.rows.scale)):
                if part is not None and mine is not None:
                    rows = stored_rows(self.shard, part, change.admitted, self.device)
                    mine.view(torch.uint8).index_copy_(0, change.slots.to(self.device), rows.view(torch.uint8))

    def stats(self) -> TierStats:
        """Its counters (reading them waits for the lookups queued so far on a GPU)."""
        hits, looked_up, owned_misses = self.counts.tolist()
        row_bytes = self.shard.format.row_bytes
        held = self.rows.weight.numel() * self.rows.weight.element_size()
        held += 0 if self.rows.scale is None else self.rows.scale.numel() * self.rows.scale.element_size()
        return TierStats(
            self.name, self.policy, self.capacity, self.admission.used,
            held + self.admission.nbytes + self._ring.numel() * 16, looked_up, hits, looked_up - hits,
            self.refreshes, self.admissions, self.evictions, self.admissions * row_bytes, hits * row_bytes,
            owned_misses * row_bytes,
        )  # fmt: skip
