"""The readers of a checkpoint file's own pages (lookup/__init__.py), each reading within the rank's
file_cache_bytes (`budget`) and counting what its reads bring in from storage (`reads`):

- FileReader: a file on tmpfs or hugetlbfs, by gather, a read that faults on a shrunk file named.
- DiskReader: a file on disk: the pages of a lookup's rows asked for at once first (read-ahead), a
  prefill's host ids read in batches of distinct rows, and prefetch asks for a lookup's pages ahead.
- TieredFileReader: a file on tmpfs or hugetlbfs through its DeviceTier, whose rows follow the file
  (a rewrite lets them go); the RAM tier's reader (ram_tier.py) stands on it for a GPU's ids."""

from __future__ import annotations

import torch

from engram.runtime.lookup.gathers import Gathers, TierGathers
from engram.runtime.lookup.spread import Spread
from engram.runtime.placement.file_reads import read_ahead, reading
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.shard import Output, TableShard
from engram.runtime.tiers.open import Tier


class FileReader(Gathers):
    """Reads a shard of a file in memory (module docstring); its batch sizes are every file reader's."""

    # Distinct rows of a file on disk read (or taken from its tier) per batch: their pages (about 8 MiB)
    # and rows fit beside a tier in a tight memory limit (bench_ram_tier: a prefill chunk asked for at
    # once read 2.7x its pages).
    batch_rows = 2048
    batched_ids = 1 << 16  # a lookup of more ids than this (a prefill chunk) reads in batches even without a tier

    def __init__(self, shard: TableShard, table_rows: int, reads: DiskReads, budget: ResidentBudget | None) -> None:
        super().__init__(shard, table_rows)
        self.reads, self.budget = reads, budget

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        return self.read(ids, out, kind, check)

    def read(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """The rows gathered from the file's pages, those of `check` (else `ids`) asked for first."""
        with self.reads(), reading(self.shard, ids if check is None else check, self.budget):
            return self.gathered(ids, out, kind, check)

    def prefetch(self, ids: torch.Tensor) -> int:
        """Bytes asked of storage ahead of a lookup of `ids`: none for a file in memory."""
        return 0


class DiskReader(FileReader):
    """Reads a shard of a file on disk (module docstring)."""

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        if check is None and not ids.is_cuda and ids.numel() > self.batched_ids:
            return self._read_in_batches(ids, out, kind)
        return self.read(ids, out, kind, check)

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
        """Start reading the pages of these rows, so that the lookup to come finds them in the page cache;
        the bytes asked for (0 where every probed page was resident)."""
        return prefetched(self.shard, self.reads, ids)


class TieredFileReader(TierGathers):
    """Reads a shard of a file through its tier (module docstring)."""

    def __init__(
        self, shard: TableShard, table_rows: int, tier: Tier, reads: DiskReads, budget: ResidentBudget | None
    ) -> None:
        super().__init__(shard, table_rows, tier)
        self.reads, self.budget = reads, budget

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        self.tier.follow_files()
        self.tier.sees(ids)
        return self.read(ids, out, kind, check)

    def read(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """The pages of the rows to read (less the tier's hits) asked for at once, then gathered, and the
        rows missed admitted to the tier while their pages are in the page cache (a RamTier's)."""
        wanted = ids if check is None else check
        if not wanted.is_cuda:  # what the tier holds is not read from the file
            wanted = wanted.reshape(-1)[~self.tier.admission.hits(wanted)]
        with self.reads(), reading(self.shard, wanted, self.budget):
            rows = self.gathered(ids, out, kind, check)
            self.tier.admit(ids)
            return rows

    def prefetch(self, ids: torch.Tensor) -> int:
        return 0


def prefetched(shard: TableShard, reads: DiskReads, ids: torch.Tensor) -> int:
    """Ask for the pages of the rows `ids` of a file on disk now (read_ahead); the bytes asked for."""
    with reads():
        asked = read_ahead(shard, ids)
    return 0 if asked is None else asked.bytes
