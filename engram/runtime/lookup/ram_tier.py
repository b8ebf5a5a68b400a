"""The reader of a file on disk with a RamTier (lookup/__init__.py): host ids are served through the tier,
which admits the rows it misses while this lookup reads them; while the tier stands aside (memory to
spare: RamTier.aside), the file is read as without a tier (DiskReader)."""

from __future__ import annotations

import contextlib

import torch

from engram.ops.checks import check_ids
from engram.runtime.lookup.file import DiskReader, FileReader, TieredFileReader, prefetched
from engram.runtime.lookup.spread import Spread
from engram.runtime.placement.file_reads import reading
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.shard import Output, TableShard
from engram.runtime.tiers.ram import RamTier
from engram.runtime.tiers.row_index import FREE


class RamTierReader(TieredFileReader):
    """Reads a shard of a file on disk through its RAM tier (module docstring); a GPU's ids, or a lookup
    that range-checks others' ids too, are read as TieredFileReader reads them."""

    tier: RamTier
    _ahead: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # a prefetch's ids, distinct, inverse

    def __init__(
        self, shard: TableShard, table_rows: int, tier: RamTier, reads: DiskReads, budget: ResidentBudget | None
    ) -> None:
        super().__init__(shard, table_rows, tier, reads, budget)
        self.beside = DiskReader(shard, table_rows, reads, budget)  # the lookups while the tier stands aside
        tier.page_cache_bound = None if budget is None else budget.budget  # what the page cache may keep of it
        tier.choose_reads(now=True)

    @property
    def batch_rows(self) -> int:
        return FileReader.batch_rows  # one batch size for every reader of a file on disk

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        tier = self.tier
        tier.settle()  # a prefetch's rows in, and whether the tier serves chosen
        if tier.aside:  # it holds no row: none can be stale, and the files are not asked (a stat and a lease)
            return self.beside.lookup(ids, out, kind, check)
        tier.follow_files()
        if ids.is_cuda or check is not None:
            return self.read(ids, out, kind, check)
        return self.from_host(ids, out, kind)

    def from_host(self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output) -> torch.Tensor:
        """A lookup of a file on disk from host ids through its RAM tier. The distinct rows it does not
        hold are admitted (Tier.admitting): read from the disk straight into their slots, all at once,
        where the tier reads past the page cache (RamTier.direct), else batch_rows at a time in address
        order through the page cache (as FileReader does a prefill), copied while their pages are
        resident. Every id's row is gathered from
        the tier while the first reads are on their way (the rows not held yet come out as zeros), and
        the rows admitted are then written to their ids. Its hits and the rows it admits are pinned until
        then (Tier.serving). A row it cannot admit (a static tier, or a lookup that pins every slot) is
        gathered from the file, batch_rows at a time, and written straight to its ids (Spread). After a
        prefetch of the same ids, their rows are the tier's once its reads are in: one gather."""
        tier = self.tier
        flat = ids.reshape(-1)
        if not flat.numel():
            return self.read(ids, out, kind, None)
        distinct, inverse = self._distinct(flat)
        with tier.serving(distinct, inverse) as slot:
            misses = ((slot == FREE) & (distinct >= self.shard.row_start) & (distinct < self.shard.row_stop)).nonzero()
            misses = misses.squeeze(1)  # others' rows and DEAD_ID keep FREE, a DEAD_ID slot: zeros
            if not misses.numel():
                return self.from_tier(slot[inverse].view(ids.shape), kind, out)
            rows, spread, admitted = None, None, torch.zeros(distinct.numel(), dtype=torch.bool)
            batch = misses.numel() if tier.direct else self.batch_rows  # direct reads leave no page to push out
            for start in range(0, misses.numel(), batch):
                at = misses[start : start + batch]
                asking = (  # direct reads: counted by the tier as they are made, and no page to ask for
                    (contextlib.nullcontext(), contextlib.nullcontext())
                    if tier.direct
                    else (self.reads(), reading(self.shard, distinct[at], self.budget, behind=True))
                )
                with asking[0], asking[1], tier.admitting(distinct[at]) as got:
                    if rows is None:  # the CPU's share of the lookup, while the disk reads the first batch
                        rows = self.from_tier(slot[inverse].view(ids.shape), kind, out)
                slot[at[: got.numel()]] = got
                admitted[at[: got.numel()]] = True
                left = at[got.numel() :]
                for first in range(0, left.numel(), self.batch_rows):  # pages that fit the page cache at once
                    part = left[first : first + self.batch_rows]
                    spread = spread or Spread(inverse, distinct.numel(), rows)
                    with self.reads(), reading(self.shard, distinct[part], self.budget):
                        spread.put(part, self.gather(distinct[part], kind))
            assert rows is not None
            late = admitted[inverse].nonzero().squeeze(1)  # the ids whose rows this lookup admitted
            for start in range(0, late.numel(), self.batch_rows):  # a few MB of transient rows at a time
                at = late[start : start + self.batch_rows]
                rows.view(flat.numel(), -1)[at] = self.from_tier(slot[inverse[at]], kind)
        return rows

    def prefetch(self, ids: torch.Tensor) -> int:
        """Start reading the rows of host ids the tier does not hold straight into it, past the page cache
        (RamTier.prefetch), while the caller does other work; the next lookup waits for them. A tier that
        reads through the page cache (or a GPU's ids) asks for their pages instead (file.prefetched).
        The bytes asked for."""
        tier = self.tier
        tier.settle()
        if tier.aside:
            return self.beside.prefetch(ids)
        if ids.is_cuda:
            return prefetched(self.shard, self.reads, ids)
        if not tier.direct:  # what the tier holds is not read from the file
            return prefetched(self.shard, self.reads, ids.reshape(-1)[~tier.admission.hits(ids)])
        flat = ids.reshape(-1)
        if not flat.numel():
            return 0
        distinct, inverse = self._distinct(flat)
        admitted = tier.prefetch(distinct)
        self._ahead = (flat.clone(), distinct, inverse)  # the lookup of the same ids reuses them, and their slots
        return admitted * self.shard.format.row_bytes

    def _distinct(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The distinct ids of a lookup's `flat` ids (int64, ascending) and where each id is among them,
        checked against the table as the file's gather would check them (the tier's reads check none);
        a prefetch's own for the same ids (taken once)."""
        ahead, self._ahead = self._ahead, None
        if (
            ahead is not None
            and ahead[0].shape == flat.shape
            and ahead[0].dtype == flat.dtype
            and torch.equal(ahead[0], flat)
        ):
            return ahead[1], ahead[2]
        distinct, inverse = torch.unique(flat, return_inverse=True)
        distinct = distinct.to(torch.int64)  # int32 ids too: the tier's rows are int64
        check_ids(distinct[[0, -1]], self.table_rows)
        return distinct, inverse
