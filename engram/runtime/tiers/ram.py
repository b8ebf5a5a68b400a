"""The RAM tier (ram_cache_bytes): hot rows of a checkpoint file on disk, in private host memory, chosen at
every lookup by CLOCK (ClockAdmission): a row a lookup misses is admitted while that lookup reads it,
straight from the disk into its slot past the page cache where direct reads work here
(direct_reads.direct_reads_work: under a memory limit the page cache's reads reclaim), else copied from the
file's pages while they are resident. Rows whose pages a sample finds in the page cache (a file that fits
in memory after all) are copied from there either way: a read past it would go to the disk for them.

A tier pays where memory is short. Where the memory left (free_bytes_now: the node's, and the process's
cgroups') would hold the shard's files SPARE times over, and file_cache_bytes would too, the page cache
keeps every page the lookups read, and a tier of rows copied out of it would only cost: the tier stands
aside (`aside`), and lookups read the file's pages as they do without a tier (its reader's DiskReader),
until memory runs short; then it serves, filling from the traffic. The choice is looked at again between
lookups, once every SPARE_EVERY_S; between those looks a lookup while it stands aside asks nothing of
the files (it holds no row to go stale) and reads no environment. ENGRAM_DIRECT_READS=1 (read when the
tier is made) has it serve and read past the page cache whatever memory is left, 0 serve and read through the
page cache; a profile's static tier always serves."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from engram.memory.host import free_bytes_now
from engram.ops.segments import Rows
from engram.runtime.placement.direct_reads import DirectReadsFailed, direct_file, direct_reads_work, read_direct
from engram.runtime.placement.file_reads import (
    READAHEAD_TIMEOUT_S,
    WAIT_MARGIN_S,
    Asked,
    all_resident,
    finished,
    reader,
)
from engram.runtime.placement.residency import DiskReads
from engram.runtime.shard import TableShard
from engram.runtime.tiers.base import TierBase
from engram.runtime.tiers.budget import Policy
from engram.runtime.tiers.choice import Change
from engram.runtime.tiers.clock import ClockAdmission
from engram.runtime.tiers.hot_rows import HotRows
from engram.runtime.tiers.row_index import FREE

log = logging.getLogger("engram")
_refusals_said: set[int] = set()  # errnos of io_uring's refusals already said in this process
SPARE = 2  # misses go through the page cache where the memory left holds the shard's files this many times
SPARE_EVERY_S = 1.0  # between two looks at the memory left (a few of the kernel's small files read)


@dataclass(frozen=True)
class Started:
    """An admission whose rows have slots and whose reads past the page cache are on their way."""

    change: Change
    parts: list[tuple[Rows, torch.Tensor]]  # the shard's parts, each with the tier's rows of it
    direct: list[bool]  # whether each part is read past the page cache
    pending: list[Future[Asked]]  # those reads
    pid: int = field(default_factory=os.getpid)  # the process whose thread makes them, into its own memory

    @property
    def elsewhere(self) -> bool:
        """Started by the process this one was forked from: no thread here will finish its reads, and the
        parent's reads land in the parent's memory, not in this copy of the slots."""
        return self.pid != os.getpid()

    def parts_where(self, *, direct: bool) -> list[tuple[Rows, torch.Tensor]]:
        return [pair for pair, past in zip(self.parts, self.direct, strict=True) if past == direct]


def wait_for(pending: list[Future[Asked]]) -> None:
    """Until reads that write a tier's slots are done, whatever they did (bounded as `finished` is)."""
    for job in pending:
        job.exception(timeout=READAHEAD_TIMEOUT_S + WAIT_MARGIN_S)


class RamTier(TierBase):
    """Hot rows of one shard of a file on disk, in host memory (module docstring)."""

    admission: ClockAdmission

    def __init__(
        self,
        shard: TableShard,
        capacity: int,
        *,
        policy: Policy = "online",
        scale_bytes: int = 0,
        disk_reads: DiskReads | None = None,
    ) -> None:
        """`disk_reads`: the table's count of what its reads bring in, to which the tier adds its reads
        past the page cache (their bytes, as they are made on another thread)."""
        admission = ClockAdmission(capacity, (shard.row_start, shard.row_stop), policy=policy)
        super().__init__(shard, admission, "cpu", "ram", scale_bytes=scale_bytes)
        self.rows = HotRows(None, self.weight, self.scale, index=admission.index)
        self.can_read_direct = policy == "online" and direct_reads_work(shard)
        self.direct = self.can_read_direct  # for the lookups from now (choose_reads)
        self.aside = False  # whether it stands aside for the lookups from now (choose_reads)
        self.page_cache_bound: int | None = None  # file_cache_bytes over the shard's files, if any
        self._files_bytes = sum({m.file_id: m.size for m in shard.files}.values())
        # told to serve (read when the tier is made, as the mapping reads ENGRAM_DIRECT_READS): no look at memory
        self._serves = os.environ.get("ENGRAM_DIRECT_READS") in ("0", "1") or policy != "online"
        self._looked_at = -math.inf
        self.choose_reads()
        self.disk_reads = disk_reads or DiskReads(True)
        self._ahead: Started | None = None  # a prefetch's admission, until the next lookup settles it
        self._known: tuple[torch.Tensor, torch.Tensor] | None = None  # a prefetch's distinct ids and their slots

    def admit(self, ids: torch.Tensor) -> int:
        """After a lookup of `ids` from a file on disk, while the pages it read are in the page cache:
        admit the rows it missed (ClockAdmission.admit); the rows admitted."""
        self.settle()
        self._known = None  # this changes slots
        change = self.admission.admit(ids)
        self._move(change)
        return change.admitted.numel()

    @contextlib.contextmanager
    def serving(self, distinct: torch.Tensor, inverse: torch.Tensor) -> Iterator[torch.Tensor]:
        """A lookup of a file on disk, made of `distinct` ids (ascending; its ids are distinct[inverse]):
        its ids counted (hits, lookups, misses of our rows), and each distinct id's slot given (FREE where
        not held) with its row pinned until the lookup ends (ClockAdmission.begin, end). For the very
        `distinct` a prefetch was given, the slots it found and took (nothing has moved a row since)."""
        self.settle()
        known, self._known = self._known, None
        if known is not None and known[0] is distinct:
            slot = known[1]
            hit = slot != FREE
        else:
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
        (ClockAdmission.take), and yield the slots of the first of them, those admitted. Their bytes are
        in the slots once the body has run: read from the disk past the page cache on the read-ahead
        thread while it runs (`direct`), else copied from the file's pages after it (the caller asked for
        them: file_reads.reading). If anything fails, the tier lets every row go rather than name rows whose
        bytes never came."""
        started = self._start(rows)
        try:
            try:
                yield started.change.slots
            finally:  # the slots are written until the reads are done, the body's error or not
                self._finish(started)
        except BaseException:
            self.admission.warm(started.change.admitted[:0])
            raise

    def prefetch(self, distinct: torch.Tensor) -> int:
        """Start admitting the rows of ours among a lookup to come's `distinct` ids (ascending) that the
        tier does not hold, read from the disk past the page cache while the caller does other work (a
        step's earlier layers); the rows admitted. Until the next lookup (of any ids) waits for them
        (settle), they and the rows held among `distinct` are pinned, as that lookup's own would be."""
        self.settle()
        hit, slot = self.admission.index.find(distinct)
        ours = (distinct >= self.shard.row_start) & (distinct < self.shard.row_stop)
        self.admission.begin(hit, slot)
        try:
            self._ahead = self._start(distinct[ours & ~hit])
        except BaseException:
            self.admission.end()
            raise
        taken = self._ahead.change.slots
        slot = slot.clone()
        slot[(ours & ~hit).nonzero().squeeze(1)[: taken.numel()]] = taken
        self._known = (distinct, slot)  # for the lookup of the same ids (serving)
        return taken.numel()

    def settle(self) -> None:
        """Wait for the rows a prefetch is reading (if one is): they are the tier's, as any admitted row,
        once this returns. Its reads' failure is raised here, the tier having let every row go. Then how
        the next lookups read is chosen (choose_reads)."""
        started, self._ahead = self._ahead, None
        if started is not None and started.elsewhere:
            self._drop_inherited(started)
        elif started is not None:
            try:
                self._finish(started)
            except BaseException:
                self._known = None
                self.admission.end()
                self.admission.warm(started.change.admitted[:0])
                raise
            self.admission.end()
        self.choose_reads()

    def choose_reads(self, *, now: bool = False) -> None:
        """Whether the tier stands aside for the lookups from now, and if not whether they read their
        misses past the page cache (`aside`, `direct`: the module docstring), looked at once every
        SPARE_EVERY_S, or `now`. Between lookups only: a lookup, and a prefetch with the lookup that
        settles it, read one way."""
        if self._serves:
            self.direct, self.aside = self.can_read_direct, False
            return
        if not now and time.monotonic() - self._looked_at < SPARE_EVERY_S:
            return  # a lookup's, twice a step: a few attribute reads and no environment
        self._looked_at = time.monotonic()
        room = free_bytes_now()
        if self.page_cache_bound is not None:
            room = min(room, self.page_cache_bound)
        aside = room >= SPARE * self._files_bytes
        if aside != self.aside:
            log.info(
                "engram: %s's RAM tier %s: the memory left (%s bytes) %s its files %d times over",
                self.shard.name, "stands aside" if aside else "serves", f"{room:,}", "holds" if aside else "does not hold",
                SPARE,
            )  # fmt: skip
        self.direct, self.aside = self.can_read_direct and not aside, aside

    def drop(self) -> None:
        """The tier is going away: wait for the reads a prefetch has in flight (they write its slots),
        whatever they did (not those of the process this one was forked from: none writes here)."""
        started, self._ahead = self._ahead, None
        if started is not None and not started.elsewhere:
            wait_for(started.pending)

    def _drop_inherited(self, started: Started) -> None:
        """A prefetch this process inherited from the one it was forked from (Started.elsewhere): its rows'
        bytes never come here, so the tier lets every row go (the parent's reads may have filled some of
        its slots before the fork, or not), and the traffic admits them again."""
        self._known = None
        self.admission.end()
        self.admission.warm(started.change.admitted[:0])
        log.info(
            "engram: %s's RAM tier lets its rows go in a forked process: its parent's reads were in flight",
            self.shard.name,
        )

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> int:
        self.settle()
        self._known = None
        return super().warm(hot, counts)

    def forget(self) -> None:
        self.settle()
        self._known = None
        super().forget()

    def _start(self, rows: torch.Tensor) -> Started:
        """Take slots for `rows` and start their reads: past the page cache on the read-ahead thread where
        `direct` (the parts in memory, block scales kept private, copied meanwhile), else none yet."""
        change = self.admission.take(rows)
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        parts = self._parts() if change.admitted.numel() else []
        past = [self.direct and direct_file(self.shard, part) for part, _ in parts]
        if any(past) and all_resident(self.shard.weight, self.shard.row_start, change.admitted):
            past = [False] * len(parts)  # their pages are cached (a file that fits after all): copied from there
        pending = [
            reader().submit(read_direct, self.shard, part, change.admitted, change.slots, mine)
            for (part, mine), direct in zip(parts, past, strict=True) if direct
        ]  # fmt: skip
        started = Started(change, parts, past, pending)
        try:
            if pending:
                self._copy(change, started.parts_where(direct=False))
        except BaseException:
            wait_for(pending)
            raise
        return started

    def _finish(self, started: Started) -> None:
        """Wait for the reads `_start` started and count them; rows io_uring could not read, and every row
        where nothing was read past the page cache, copied from the file's pages."""
        try:
            asked = finished(started.pending, self.shard)
        except DirectReadsFailed as exc:  # io_uring failed this lookup, not the disk: the page cache serves
            self._say_refused(exc)
            with self.disk_reads():
                self._copy(started.change, started.parts_where(direct=True))
        else:
            self.disk_reads.bytes += sum(a.bytes for a in asked)
        if not started.pending:  # a direct tier's copies read their own pages; the caller counts the others'
            with self.disk_reads() if self.direct else contextlib.nullcontext():
                self._copy(started.change, started.parts_where(direct=False))

    @staticmethod
    def _say_refused(exc: DirectReadsFailed) -> None:
        """io_uring's refusal, said once per errno: the lookups it fails read through the page cache
        instead, each time, so a ring that works again is used again."""
        if exc.code not in _refusals_said:
            _refusals_said.add(exc.code)
            log.warning("engram: %s; the lookups it fails read them through the page cache", exc)
