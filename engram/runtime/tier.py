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
so the hit rates it reports are those this code serves.

The RAM tier over a file-backed table chooses on every lookup instead (EagerAdmission): right after a
lookup the pages of the rows it missed are in the page cache, so admitting them then costs a copy, not a
disk read, while a window later most of them have been pushed out again. Each distinct row of a lookup
counts once (a page is read once per lookup however often its rows repeat in it), and a missed row takes
the slot of a held row whose estimate it beats. In a replay of bench_ram_tier's stream (a V4.1-shaped
table four times the memory) beside a simulated LRU of the pages left, admitting after every lookup read
0.73x the pages an LRU of the whole memory reads, and the windowed refresh 0.88x; measured under a real
memory limit, see bench_ram_tier."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from engram.errors import EngramError
from engram.runtime.cache import COUNTS, EMPTY_KEY, HotRows, find, stored_rows
from engram.runtime.placement.filemap import files_named_on_fault, read_ahead
from engram.runtime.placement.storage import TableShard
from engram.runtime.rowindex import RowIndex, spare_for
from engram.runtime.sketch import DEPTH, FrequencySketch, sketch_width

Policy = Literal["online", "static"]
POLICIES: tuple[Policy, ...] = ("online", "static")
TierName = Literal["device", "ram"]
WINDOW_IDS = 1 << 17  # ids served between refreshes: about 4k tokens of a table looked up at 32 columns
HALF_LIFE = 32  # windows between halvings of the sketch: about 128k tokens
MAX_SKETCH_WIDTH = 1 << 22  # 64 MiB of counters at most, per table
# A RAM tier's sketch halves every 64 lookups of its table (the replay of bench_ram_tier's stream above:
# 32 to 80 read within 3% of the fewest pages, 128 read 12% more).
LOOKUP_HALF_LIFE = 64
VICTIM_SAMPLES = 16  # held rows drawn per candidate, the weakest its victim: 1% more pages than the exact weakest
CANDIDATE_CHUNK = 8192  # missed rows contested (and admitted rows copied) at a time: a few MB of transients


def width_for(capacity: int, window_ids: int, table_rows: int) -> int:
    """The sketch's width for a tier: room for the rows it holds and a window's ids, never more than the
    rows it can be asked about."""
    return min(MAX_SKETCH_WIDTH, sketch_width(min(table_rows, capacity + window_ids)))


def state_bytes(rows: int, table_rows: int, window_ids: int, policy: Policy, eager: bool) -> int:
    """Bytes of a tier's own state besides its rows: the ids and slots of the rows it holds, and online
    the ring of a window's ids, or for a tier that admits after every lookup (EagerAdmission) each slot's
    row and score and the index's spare room, and the sketch."""
    if policy != "online":
        return rows * 16
    if eager:
        return rows * (16 + 12) + spare_for(rows) * 16 + DEPTH * 4 * width_for(rows, rows, table_rows)
    return rows * 16 + window_ids * 16 + DEPTH * 4 * width_for(rows, window_ids, table_rows)


def capacity_for(
    budget_bytes: int,
    row_bytes: int,
    table_rows: int,
    window_ids: int = WINDOW_IDS,
    policy: Policy = "online",
    eager: bool = False,
) -> int:
    """The most rows (of a shard of `table_rows`) a tier of `budget_bytes` holds, its own state counted
    (state_bytes)."""
    per_row = row_bytes + 16

    def needs(rows: int) -> int:
        return rows * row_bytes + state_bytes(rows, table_rows, window_ids, policy, eager)

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
    ) -> None:
        if capacity <= 0:
            raise EngramError(f"a tier holds at least one row, not {capacity}")
        self.capacity, self.rows, self.policy = capacity, rows, policy
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
        owned, owned_counts = owned_rows(hot.to(self.keys.device), counts, self.rows, self.capacity)
        if owned_counts is not None and self.sketch is not None:
            self.sketch.add(owned, owned_counts)
        evicted = self.used
        slots = torch.arange(self.capacity, device=self.slots.device)
        self._set(owned[:0], slots[:0], owned, slots[: owned.numel()], slots[owned.numel() :])
        return Change(owned, slots[: owned.numel()], evicted)

    def refresh(self, window: torch.Tensor) -> Change:
        """Count the ids `window` served and keep the `capacity` rows of highest estimate among those held
        and those in the window (module docstring); a static tier changes nothing."""
        if self.sketch is None:
            return Change(window[:0], self.slots[:0], 0)
        window = window.reshape(-1).to(torch.int64)
        window = window[(window >= self.rows[0]) & (window < self.rows[1])]
        self.sketch.add(window)
        held, held_slots = self.keys[: self.used], self.slots[: self.used]
        seen = torch.unique(window)
        _, known = find(self.keys, seen)
        new = seen[~known]
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

    def held_rows(self) -> torch.Tensor:
        """The rows held, ascending."""
        return self.keys[: self.used]


class EagerAdmission:
    """Which rows of [row_start, row_stop) a RAM tier of `capacity` rows holds, changed after every lookup
    (module docstring): `index` maps the rows held to their slots; `row_of_slot` and `score` (the row's
    estimate when it was last looked up, halved with the sketch) say what each slot holds and how hot it
    was. Host memory."""

    def __init__(
        self,
        capacity: int,
        rows: tuple[int, int],
        *,
        policy: Policy = "online",
        half_life: int = LOOKUP_HALF_LIFE,
        seed: int = 0,
    ) -> None:
        self.capacity, self.rows, self.policy = capacity, rows, policy
        self.index = RowIndex(capacity)
        self.row_of_slot = torch.full((capacity,), EMPTY_KEY, dtype=torch.int64)
        self.score = torch.zeros(capacity, dtype=torch.int32)
        width = width_for(capacity, capacity, rows[1] - rows[0])
        self.sketch = FrequencySketch(width) if policy == "online" else None
        self.half_life, self.lookups = half_life, 0
        self._victims = torch.Generator().manual_seed(seed)

    @property
    def used(self) -> int:
        """Rows held: they fill slots [0, used), since a row evicted hands its slot straight to the next."""
        return self.index.held

    @property
    def nbytes(self) -> int:
        """Bytes of the choice's own state: the index, each slot's row and score, the sketch."""
        sketch = 0 if self.sketch is None else self.sketch.nbytes
        return self.index.nbytes + self.capacity * 12 + sketch

    def hits(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id is held."""
        return self.index.find(ids.reshape(-1).to(torch.int64))[0]

    def held_rows(self) -> torch.Tensor:
        """The rows held, ascending."""
        return self.index.held_rows()

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> Change:
        """Hold the first rows of `hot` that are ours, as many as fit (Admission.warm); their counts, if
        given, start the estimate and their scores."""
        owned, owned_counts = owned_rows(hot, counts, self.rows, self.capacity)
        evicted = self.used
        self.index.clear()
        slots = torch.arange(owned.numel())
        self.index.add(owned, slots)
        self.row_of_slot.fill_(EMPTY_KEY)
        self.row_of_slot[slots] = owned
        self.score.zero_()
        if self.sketch is not None and owned_counts is not None:
            self.sketch.add(owned, owned_counts)
            self.score[slots] = self.sketch.estimate(owned)
        return Change(owned, slots, evicted)

    def admit(self, ids: torch.Tensor, *, same_lookup: bool = False) -> Change:
        """Count a lookup's `ids` and admit the rows it missed (observe, then take); `same_lookup`: these
        ids are another part of the lookup the last call counted, not a lookup of their own."""
        flat = torch.unique(ids.reshape(-1).to(device="cpu", dtype=torch.int64))  # a GPU engine's ids: the tier is RAM
        hit, slot = self.index.find(flat)
        estimate = self.observe(flat, hit, slot, same_lookup=same_lookup)
        return self.take(flat[~hit], estimate[~hit])

    def observe(
        self, distinct: torch.Tensor, hit: torch.Tensor, slot: torch.Tensor, *, same_lookup: bool = False
    ) -> torch.Tensor:
        """Count a lookup's `distinct` ids (ascending, each once: a page is read once per lookup however
        often its rows repeat in it) whose `hit` and `slot` index.find gave, the held ones' scores set to
        their estimates; each id's estimate (0 for rows not ours). Every `half_life` lookups the estimates
        and scores are halved first."""
        if self.sketch is None:
            return torch.zeros(distinct.numel(), dtype=torch.int32)
        if not same_lookup:
            self.lookups += 1
            if self.lookups % self.half_life == 0:
                self.sketch.halve()
                self.score.bitwise_right_shift_(1)
        ours = (distinct >= self.rows[0]) & (distinct < self.rows[1])
        self.sketch.add(distinct[ours])
        estimate = torch.where(ours, self.sketch.estimate(distinct), 0)
        self.score[slot[hit]] = estimate[hit]
        return estimate

    def take(self, rows: torch.Tensor, estimate: torch.Tensor) -> Change:
        """Admit rows a lookup missed (not held, distinct; `estimate` from observe): into free slots while
        there are any, then each into the slot of the weakest of VICTIM_SAMPLES held rows drawn for it,
        when its estimate beats that row's score (the hottest candidates first; a slot goes to one
        candidate). Rows not ours, and any row of a static tier, are left out."""
        if self.sketch is None:
            return Change(rows[:0], rows[:0], 0)
        ours = (rows >= self.rows[0]) & (rows < self.rows[1])
        order = torch.argsort(estimate[ours], descending=True, stable=True)
        new, new_estimate = rows[ours][order], estimate[ours][order]
        take = min(self.capacity - self.used, new.numel())
        slots = torch.arange(self.used, self.used + take)
        self._hold(new[:take], slots, new_estimate[:take])
        admitted, taken, evicted = [new[:take]], [slots], 0
        for start in range(take, new.numel(), CANDIDATE_CHUNK):  # bounded transients, even for a prefill chunk
            rows, rows_estimate = new[start : start + CANDIDATE_CHUNK], new_estimate[start : start + CANDIDATE_CHUNK]
            wins, victims = self._beaten(rows_estimate)
            self.index.remove(self.row_of_slot[victims])
            self._hold(rows[wins], victims, rows_estimate[wins])
            admitted.append(rows[wins])
            taken.append(victims)
            evicted += victims.numel()
        return Change(torch.cat(admitted), torch.cat(taken), evicted)

    def _hold(self, rows: torch.Tensor, slots: torch.Tensor, estimate: torch.Tensor) -> None:
        self.index.add(rows, slots)
        self.row_of_slot[slots] = rows
        self.score[slots] = estimate

    def _beaten(self, estimate: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For candidates of `estimate` (descending) with every slot full: which of them win a slot, and the
        slots they win. Each draws VICTIM_SAMPLES slots and contests the one of lowest score; a slot
        drawn by several goes to the first (the hottest), and a candidate wins only what it beats."""
        count = estimate.numel()
        drawn = torch.randint(0, self.capacity, (count, VICTIM_SAMPLES), generator=self._victims)
        victim = drawn.gather(1, self.score[drawn].argmin(dim=1, keepdim=True)).squeeze(1)
        distinct, inverse = torch.unique(victim, return_inverse=True)
        first = torch.full((distinct.numel(),), count).scatter_reduce_(0, inverse, torch.arange(count), "amin")
        wins = torch.zeros(count, dtype=torch.bool)
        wins[first] = True
        wins &= estimate > self.score[victim]
        return wins, victim[wins]


def owned_rows(
    hot: torch.Tensor, counts: torch.Tensor | None, rows: tuple[int, int], capacity: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A profile's first `capacity` rows in [rows) (global ids, most frequent first) and their counts."""
    if hot.dtype != torch.int64 or hot.dim() != 1:
        raise EngramError(f"a profile's hot rows are a 1-D int64 tensor; got {hot.dtype} {list(hot.shape)}")
    if counts is not None and counts.shape != hot.shape:
        raise EngramError(f"a profile's counts are one per hot row: {list(counts.shape)} for {hot.numel()} rows")
    mine = (hot >= rows[0]) & (hot < rows[1])
    owned = hot[mine][:capacity]
    if torch.unique(owned).numel() != owned.numel():
        raise EngramError("the profile lists a row twice; write it again with `engram profile --out`")
    return owned, None if counts is None else counts.to(hot.device)[mine][:capacity]


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
        rows = (shard.row_start, shard.row_stop)
        # A file on disk (always a tier in host memory): rows are admitted right after the lookup that
        # read their pages, while those are in the page cache (EagerAdmission).
        self.admission: Admission | EagerAdmission = (
            EagerAdmission(capacity, rows, policy=policy)
            if shard.readahead
            else Admission(capacity, rows, device, policy=policy, half_life=half_life, window_ids=window_ids)
        )
        weight = torch.zeros(capacity, *shard.weight.shape[1:], dtype=shard.weight.dtype, device=device)
        scale = None
        if shard.scale is not None:
            scale = torch.zeros(capacity, *shard.scale.shape[1:], dtype=shard.scale.dtype, device=device)
        if isinstance(self.admission, EagerAdmission):
            self.rows = HotRows(None, weight, scale, index=self.admission.index)
        else:
            self.rows = HotRows(self.admission.keys, weight, scale, self.admission.slots)
        self.counts = torch.zeros(COUNTS, dtype=torch.int64, device=device)
        self.window_ids = window_ids
        windowed = policy == "online" and isinstance(self.admission, Admission)
        self._ring = torch.zeros(window_ids if windowed else 0, dtype=torch.int64, device=device)
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
    def eager(self) -> bool:
        """Whether it admits after every lookup (a file on disk) rather than once a window was served."""
        return isinstance(self.admission, EagerAdmission)

    @property
    def due(self) -> bool:
        """Whether a window of ids was served since the last refresh (as far as the host saw)."""
        return self._ring.numel() > 0 and self.since >= self.window_ids

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
        between steps, never while a CUDA stream captures. A tier that admits after every lookup has
        nothing to do here."""
        if not self._ring.numel():
            return 0
        assert isinstance(self.admission, Admission)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise EngramError("a tier refreshes between steps, not while a CUDA graph is being captured")
        served = min(int(self._served), self._ring.numel())  # the one read back to the host
        change = self.admission.refresh(self._ring[:served])
        self._served.zero_()
        self.since = 0
        self.refreshes += 1
        self._move(change)
        return change.admitted.numel()

    def admit(self, ids: torch.Tensor, *, same_lookup: bool = False) -> int:
        """After a lookup of `ids` from a file on disk, while the pages it read are in the page cache:
        admit the rows it missed that beat held ones (EagerAdmission.admit); the rows admitted."""
        if not isinstance(self.admission, EagerAdmission):
            return 0
        change = self.admission.admit(ids, same_lookup=same_lookup)
        self._move(change)
        return change.admitted.numel()

    def observe(
        self, distinct: torch.Tensor, hit: torch.Tensor, slot: torch.Tensor, inverse: torch.Tensor
    ) -> torch.Tensor:
        """A lookup of a file on disk, made of `distinct` ids (its ids are distinct[inverse]) of which the
        tier holds `hit` in `slot`: its ids counted (hits, lookups, misses of our rows) and its rows by the
        admission (EagerAdmission.observe); each distinct id's estimate, for admit_read."""
        assert isinstance(self.admission, EagerAdmission)
        ours = (distinct >= self.shard.row_start) & (distinct < self.shard.row_stop)
        times = torch.bincount(inverse, minlength=distinct.numel())
        self.counts += torch.stack([times[hit].sum(), times.sum(), times[ours & ~hit].sum()])
        return self.admission.observe(distinct, hit, slot)

    def admit_read(self, rows: torch.Tensor, estimate: torch.Tensor) -> int:
        """Admit rows just read from the file (not held; `estimate` from observe) while their pages are in
        the page cache (EagerAdmission.take); the rows admitted."""
        assert isinstance(self.admission, EagerAdmission)
        change = self.admission.take(rows, estimate)
        self._move(change)
        return change.admitted.numel()

    def _move(self, change: Change) -> None:
        """Copy the admitted rows into their slots."""
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        if not change.admitted.numel():
            return
        if self.shard.readahead:  # a file on disk: any page out (a warm start) asked for at once, sorted and coalesced
            read_ahead(self.shard, change.admitted)
        with files_named_on_fault(self.shard):
            for part, mine in ((self.shard.weight, self.rows.weight), (self.shard.scale, self.rows.scale)):
                if part is None or mine is None:
                    continue
                for start in range(0, change.admitted.numel(), CANDIDATE_CHUNK):  # a few MB in flight at most
                    rows = stored_rows(self.shard, part, change.admitted[start : start + CANDIDATE_CHUNK], self.device)
                    slots = change.slots[start : start + CANDIDATE_CHUNK].to(self.device)
                    mine.view(torch.uint8).index_copy_(0, slots, rows.view(torch.uint8))

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
