"""The RAM tier (ram_cache_bytes): hot rows of a checkpoint file on disk, in private host memory, chosen at
every lookup by CLOCK (ClockAdmission): a row a lookup misses is admitted while that lookup reads it,
straight from the disk into its slot past the page cache where direct reads work here
(filemap.direct_reads_work: under a memory limit the page cache's reads reclaim), else copied from the
file's pages while they are resident."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from concurrent.futures import Future

import torch

from engram.runtime.placement.filemap import (
    Asked,
    DirectReadsFailed,
    direct_file,
    direct_reads_work,
    finished,
    read_direct,
    reader,
)
from engram.runtime.shard import TableShard
from engram.runtime.tiers.base import TierBase
from engram.runtime.tiers.budget import Policy, TierName
from engram.runtime.tiers.clock import ClockAdmission
from engram.runtime.tiers.hot_rows import HotRows

log = logging.getLogger("engram")
_refusals_said: set[int] = set()  # errnos of io_uring's refusals already said in this process


class RamTier(TierBase):
    """Hot rows of one shard of a file on disk, in host memory (module docstring)."""

    admission: ClockAdmission

    def __init__(
        self,
        shard: TableShard,
        capacity: int,
        name: TierName = "ram",
        *,
        policy: Policy = "online",
        scale_bytes: int = 0,
    ) -> None:
        admission = ClockAdmission(capacity, (shard.row_start, shard.row_stop), policy=policy)
        super().__init__(shard, admission, "cpu", name, scale_bytes=scale_bytes)
        self.rows = HotRows(None, self.weight, self.scale, index=admission.index)
        self.direct = policy == "online" and direct_reads_work(shard)

    def admit(self, ids: torch.Tensor) -> int:
        """After a lookup of `ids` from a file on disk, while the pages it read are in the page cache:
        admit the rows it missed (ClockAdmission.admit); the rows admitted."""
        change = self.admission.admit(ids)
        self._move(change)
        return change.admitted.numel()

    @contextlib.contextmanager
    def serving(self, distinct: torch.Tensor, inverse: torch.Tensor) -> Iterator[torch.Tensor]:
        """A lookup of a file on disk, made of `distinct` ids (ascending; its ids are distinct[inverse]):
        its ids counted (hits, lookups, misses of our rows), and each distinct id's slot given (FREE where
        not held) with its row pinned until the lookup ends (ClockAdmission.begin, end)."""
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
        them: filemap.reading). If anything fails, the tier lets every row go rather than name rows whose
        bytes never came."""
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
