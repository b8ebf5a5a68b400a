"""The reader of a checkpoint file's own pages (lookup/__init__.py): the pages of the rows a lookup reads
(less its tier's) asked for at once, within the rank's file_cache_bytes, then gathered; on disk, a
prefill's host ids read in batches of distinct rows; rows a tier missed admitted while their pages are
resident."""

from __future__ import annotations

import logging

import torch

from engram.runtime.lookup.memory import Reader
from engram.runtime.lookup.spread import Spread
from engram.runtime.placement.file_changes import being_written, rewritten
from engram.runtime.placement.file_reads import read_ahead, reading, scales_from
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.shard import Output, TableShard
from engram.runtime.tiers.open import Tier

log = logging.getLogger("engram")


class FileReader(Reader):
    """Reads a file-backed shard (module docstring); `budget`: the resident-set budget its files share with
    the rank's other tables (file_cache_bytes)."""

    # Distinct rows of a file on disk read (or taken from its tier) per batch: their pages (about 8 MiB)
    # and rows fit beside a tier in a tight memory limit (bench_ram_tier: a prefill chunk asked for at
    # once read 2.7x its pages).
    batch_rows = 2048
    batched_ids = 1 << 16  # a lookup of more ids than this (a prefill chunk) reads in batches even without a tier

    def __init__(
        self,
        shard: TableShard,
        table_rows: int,
        tier: Tier | None,
        reads: DiskReads,
        budget: ResidentBudget | None,
    ) -> None:
        super().__init__(shard, table_rows, tier, reads)
        self.budget = budget
        self.written: list[str] = []  # the files a process had open for writing at the last lookup

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        if self.tier is not None:
            self._forget_if_changed(self.tier)
            self.tier.sees(ids)
        if self.shard.readahead and not ids.is_cuda and check is None:
            return self.from_host(ids, out, kind)
        return self.read(ids, out, kind, check)

    def from_host(self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output) -> torch.Tensor:
        """A lookup of a file on disk from host ids: a prefill chunk's in batches."""
        if ids.numel() > self.batched_ids:
            return self._read_in_batches(ids, out, kind)
        return self.read(ids, out, kind, None)

    def _forget_if_changed(self, tier: Tier) -> None:
        """Before a lookup through a tier: a file behind the table rewritten in place since the tier copied
        rows from it (`cp new old`: same inode, same size) makes those rows stale. The tier lets them all
        go, its private block scales are read again, and the traffic admits rows again from the file as it
        now is; noticed at the first lookup after the rewrite's last write. A process that has the file
        open for writing (being_written, any namespace) may change rows through a mapping without changing
        any time: while one does, the tier lets its rows go before every lookup (each lookup's rows are
        read during it) and block scales are read from the file, until it is gone."""
        shard = self.shard
        changed, writing = rewritten(shard), being_written(shard) or []
        if writing and writing != self.written:
            log.warning(
                "engram: %s is open for writing by another process: %s's tier keeps no row from one lookup to "
                "the next while it is (each lookup reads its rows from the file)",
                ", ".join(writing), shard.name,
            )  # fmt: skip
        elif changed:
            log.warning(
                "engram: %s changed while mapped: %s's tier lets its %d rows go and reads them again from the file",
                ", ".join(changed), shard.name, tier.admission.used,
            )  # fmt: skip
        if writing or changed or self.written:
            tier.forget()
            scales_from(shard, private=not writing)
        self.written = writing

    def read(
        self,
        ids: torch.Tensor,
        out: torch.Tensor | None,
        kind: Output,
        check: torch.Tensor | None,
    ) -> torch.Tensor:
        """A lookup of a file-backed table: the pages of the rows to read (less the tier's) asked for at
        once, then gathered, and the rows missed admitted to the tier while their pages are in the page
        cache."""
        wanted = ids if check is None else check
        if self.tier is not None and not wanted.is_cuda:  # what the tier holds is not read from the file
            wanted = wanted.reshape(-1)[~self.tier.admission.hits(wanted)]
        with self.reads(), reading(self.shard, wanted, self.budget):
            rows = self.gathered(ids, out, kind, check)
            if self.tier is not None:
                self.tier.admit(ids)
            return rows

    def _read_in_batches(self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output) -> torch.Tensor:
        """A lookup of a file on disk from host ids: each distinct row read once, batch_rows at a time
        in address order (their pages asked for, then gathered), each batch's rows written straight to
        every id that asked for them. Batches, because a prefill chunk's pages can be more than the memory
        left for the page cache: asked for all at once, they push each other out before the gather reaches
        them, and are read twice."""
        distinct, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        spread = Spread(inverse, distinct.numel(), out)
        for start in range(0, distinct.numel(), self.batch_rows):
            at = torch.arange(start, min(start + self.batch_rows, distinct.numel()))
            with self.reads(), reading(self.shard, distinct[at], self.budget):
                spread.put(at, self.gather(distinct[at], kind))
        return spread.result(ids.shape, out)

    def prefetch(self, ids: torch.Tensor) -> int:
        """Start reading the pages of these rows of a file-backed table on disk, so that the lookup to come
        finds them in the page cache; the bytes asked for (0 where every probed page was resident, or the
        table is in memory)."""
        if not self.shard.readahead:
            return 0
        if self.tier is not None and not ids.is_cuda:  # what the tier holds is not read from the file
            ids = ids.reshape(-1)[~self.tier.admission.hits(ids)]
        with self.reads():
            asked = read_ahead(self.shard, ids)
        return 0 if asked is None else asked.bytes
