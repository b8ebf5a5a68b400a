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
disk read, while a window later most of them have been pushed out again. It admits every row it misses
and evicts by CLOCK (a referenced bit per slot, a hand that clears the bits it passes and reuses the
first slot whose bit is clear): on text, recency is what predicts the next lookups of a row (the same
document's n-grams), and its state is a byte a slot. In a replay of bench_ram_tier's stream (a V4.1-shaped
table four times the memory, 14.6% of its rows held) CLOCK hit 52.3% of a step's distinct rows, an LRU of
rows 52.6%, the frequency estimate with sampled victims this replaced 49.3% and S3-FIFO 50.2%; Belady's
bound is 71.6%."""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal

import torch

from engram.errors import EngramError
from engram.ops import cpu
from engram.ops.segments import Rows
from engram.runtime.placement.filemap import (
    Asked,
    DirectReadsFailed,
    direct_file,
    direct_reads_work,
    files_named_on_fault,
    finished,
    read_ahead,
    read_direct,
    reader,
)
from engram.runtime.rowindex import FREE, RowIndex, buckets_for, native
from engram.runtime.shard import TableShard
from engram.runtime.sketch import DEPTH, FrequencySketch, sketch_width
from engram.runtime.tiers.hot_rows import COUNTS, EMPTY_KEY, HotRows, find, merge, stored_rows

Policy = Literal["online", "static"]
POLICIES: tuple[Policy, ...] = ("online", "static")
TierName = Literal["device", "ram"]
WINDOW_IDS = 1 << 17  # ids served between refreshes: about 4k tokens of a table looked up at 32 columns
HALF_LIFE = 32  # windows between halvings of the sketch: about 128k tokens
MAX_SKETCH_WIDTH = 1 << 22  # 64 MiB of counters at most, per table
CANDIDATE_CHUNK = 8192  # admitted rows copied at a time: a few MB of transients
log = logging.getLogger("engram")
_refusals_said: set[int] = set()  # errnos of io_uring's refusals already said in this process


def width_for(capacity: int, window_ids: int, table_rows: int) -> int:
    """The sketch's width for a tier: room for the rows it holds and a window's ids, never more than the
    rows it can be asked about."""
    return min(MAX_SKETCH_WIDTH, sketch_width(min(table_rows, capacity + window_ids)))


def state_bytes(rows: int, table_rows: int, window_ids: int, policy: Policy, eager: bool) -> int:
    """Bytes of a tier's own state besides its rows: for a tier that admits after every lookup
    (EagerAdmission) the index's hash table and each slot's row and referenced bit; else the ids and slots
    of the rows it holds, and online the ring of a window's ids and the sketch."""
    if eager:
        return buckets_for(rows) * 8 + rows * 5
    if policy != "online":
        return rows * 16
    return rows * 16 + window_ids * 16 + DEPTH * 4 * width_for(rows, window_ids, table_rows)


def tier_bytes(
    rows: int,
    row_bytes: int,
    table_rows: int,
    window_ids: int = WINDOW_IDS,
    policy: Policy = "online",
    eager: bool = False,
) -> int:
    """The bytes a tier holding `rows` rows takes: the rows and its own state (state_bytes)."""
    return rows * row_bytes + state_bytes(rows, table_rows, window_ids, policy, eager)


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
        return tier_bytes(rows, row_bytes, table_rows, window_ids, policy, eager)

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
        ids, new_slots = merge(kept, kept_slots, added[order], slots[order])
        count = ids.numel()
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


# A RAM tier slot's state (engram_clock_sweep): its bit clear or set, or pinned while a lookup reads it.
CLEAR, SET, PINNED = 0, 1, 2


class EagerAdmission:
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
        """Hold the first rows of `hot` that are ours, as many as fit (Admission.warm), each referenced: a
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
    bytes: int  # its memory: the rows' slots, their ids and slots, the sketch, the block scales it keeps
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
        scale_bytes: int = 0,
    ) -> None:
        """`scale_bytes`: the shard's block scales kept in private memory for it, counted in its bytes."""
        self.shard, self.name, self.device = shard, name, torch.device(device)
        self.scale_bytes = scale_bytes
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
        # Misses of a file on disk read from it straight into their slots, past the page cache, where
        # that works here (filemap.direct_reads_work): under a memory limit the page cache's reads reclaim.
        self.direct = self.eager and policy == "online" and direct_reads_work(shard)

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
        self._move(self.admission.warm(hot, counts), cold=True)
        return self.admission.used

    def forget(self) -> None:
        """Let every row go (their bytes are no longer the table's): the traffic admits them again."""
        self.admission.warm(torch.empty(0, dtype=torch.int64))

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

    def admit(self, ids: torch.Tensor) -> int:
        """After a lookup of `ids` from a file on disk, while the pages it read are in the page cache:
        admit the rows it missed (EagerAdmission.admit); the rows admitted."""
        if not isinstance(self.admission, EagerAdmission):
            return 0
        change = self.admission.admit(ids)
        self._move(change)
        return change.admitted.numel()

    @contextlib.contextmanager
    def serving(self, distinct: torch.Tensor, inverse: torch.Tensor) -> Iterator[torch.Tensor]:
        """A lookup of a file on disk, made of `distinct` ids (ascending; its ids are distinct[inverse]):
        its ids counted (hits, lookups, misses of our rows), and each distinct id's slot given (FREE where
        not held) with its row pinned until the lookup ends (EagerAdmission.begin, end)."""
        assert isinstance(self.admission, EagerAdmission)
        hit, slot = self.admission.index.find(distinct)
        ours = (distinct >= self.shard.row_start) & (distinct < self.shard.row_stop)
        times = torch.bincount(inverse, minlength=distinct.numel())
        self.counts += torch.stack([times[hit].sum(), times.sum(), times[ours & ~hit].sum()])
        self.admission.begin(hit, slot)
        try:
            yield slot
        finally:
            self.admission.end()

    @contextlib.contextmanager
    def admitting(self, rows: torch.Tensor) -> Iterator[torch.Tensor]:
        """Admit rows of ours the lookup in progress missed (not held, ascending), inside `serving`
        (EagerAdmission.take), and yield the slots of the first of them, those admitted. Their bytes are
        in the slots once the body has run: read from the disk past the page cache on the read-ahead
        thread while it runs (`direct`), else copied from the file's pages after it (the caller asked for
        them: filemap.reading). If anything fails, the tier lets every row go rather than name rows whose
        bytes never came."""
        assert isinstance(self.admission, EagerAdmission)
        change = self.admission.take(rows)
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        parts = self._parts() if change.admitted.numel() else []
        past = [self.direct and direct_file(self.shard, part) for part, _ in parts]
        pending = [
            reader().submit(read_direct, self.shard, part, change.admitted, change.slots, mine)
            for (part, mine), direct in zip(parts, past, strict=True) if direct
        ]  # fmt: skip
        copied = [pair for pair, direct in zip(parts, past, strict=True) if not direct]
        try:
            try:
                if pending:  # the parts in memory (block scales kept private) copied while the disk reads
                    self._copy(change, copied)
                yield change.slots
            finally:  # the slots are written until the reads are done, the body's error or not
                refused = self._direct_refused(pending)
            if refused:  # io_uring failed this lookup, not the disk: its rows come through the page cache
                self._copy(change, [pair for pair, direct in zip(parts, past, strict=True) if direct])
            if not pending:  # from the file's pages, asked for by the caller, after the body's work
                self._copy(change, copied)
        except BaseException:
            self.admission.warm(change.admitted[:0])
            raise

    def _direct_refused(self, pending: list[Future[Asked]]) -> bool:
        """Wait for the reads past the page cache; True when io_uring could not make them (said once per
        errno): the caller reads those rows through the page cache instead, this lookup only, so a
        ring that works again is used again. Any other failure (the disk's) is raised."""
        try:
            finished(pending, self.shard)
        except DirectReadsFailed as exc:
            if exc.code not in _refusals_said:
                _refusals_said.add(exc.code)
                log.warning("engram: %s; the lookups it fails read them through the page cache", exc)
            return True
        return False

    def _parts(self) -> list[tuple[Rows, torch.Tensor]]:
        """The shard's weight and scale, each with the tier's rows of it."""
        pairs = ((self.shard.weight, self.rows.weight), (self.shard.scale, self.rows.scale))
        return [(part, mine) for part, mine in pairs if part is not None and mine is not None]

    def _move(self, change: Change, *, cold: bool = False) -> None:
        """Copy the admitted rows into their slots; `cold`: their pages may be out of the page cache (a
        warm start's, where an admission after a lookup copies rows the lookup just read)."""
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        if not change.admitted.numel():
            return
        if cold and self.shard.readahead:  # a file on disk: its pages asked for at once, sorted and coalesced
            read_ahead(self.shard, change.admitted)
        try:
            self._copy(change, self._parts())
        except BaseException:  # the index names rows whose bytes never came: hold none rather than serve them
            self.admission.warm(change.admitted[:0])
            raise

    def _copy(self, change: Change, parts: list[tuple[Rows, torch.Tensor]]) -> None:
        """The admitted rows of each (shard part, tier rows) pair copied from the part into their slots."""
        with files_named_on_fault(self.shard):
            for part, mine in parts:
                for start in range(0, change.admitted.numel(), CANDIDATE_CHUNK):  # a few MB in flight at most
                    chunk = change.admitted[start : start + CANDIDATE_CHUNK]
                    rows = stored_rows(self.shard, part, chunk, self.device)
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
            held + self.admission.nbytes + self._ring.numel() * 16 + self.scale_bytes, looked_up, hits, looked_up - hits,
            self.refreshes, self.admissions, self.evictions, self.admissions * row_bytes, hits * row_bytes,
            owned_misses * row_bytes,
        )  # fmt: skip
