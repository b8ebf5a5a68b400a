"""How a table's rows are read, one reader per lookup mode, chosen when the table opens and again when it
gets or loses a tier (reader_for); Table.lookup delegates to it. Each reader holds what was decided at
open (the mode, its tier or none, whether a GPU's ids are staged through host threads) and owns its whole
lookup, readable in its own file and gathers.py:

- memory.py: a table in memory (device tensor, host memory the GPU reads over UVA, huge pages, a node copy
  or a replicas' memfd), gathered by the op for the ids' device: Reader alone, TieredReader through its
  DeviceTier.
- file.py: a checkpoint file's own pages: FileReader on tmpfs or hugetlbfs, DiskReader on disk (pages
  asked for first, within file_cache_bytes, a prefill's ids read in batches), TieredFileReader through a
  DeviceTier.
- ram_tier.py: RamTierReader, a file on disk with a RamTier: the rows it holds come from it, the rows it
  misses are read into it (from the disk past the page cache where that works and memory is short) and
  from it.

The gathers all of them build (gathers.py) and the spread of distinct rows back to their ids (spread.py)
are shared parts."""

from __future__ import annotations

from engram.runtime.lookup.file import DiskReader, FileReader, TieredFileReader
from engram.runtime.lookup.memory import Reader, TieredReader
from engram.runtime.lookup.ram_tier import RamTierReader
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.shard import TableShard
from engram.runtime.tiers.open import Tier
from engram.runtime.tiers.ram import RamTier

AnyReader = Reader | TieredReader | FileReader | TieredFileReader


def reader_for(
    shard: TableShard, table_rows: int, tier: Tier | None, budget: ResidentBudget | None, reads: DiskReads
) -> AnyReader:
    """The reader of this table's mode (module docstring)."""
    if isinstance(tier, RamTier):
        return RamTierReader(shard, table_rows, tier, reads, budget)
    if not shard.files:
        return Reader(shard, table_rows) if tier is None else TieredReader(shard, table_rows, tier)
    if tier is None:
        return (DiskReader if shard.readahead else FileReader)(shard, table_rows, reads, budget)
    return TieredFileReader(shard, table_rows, tier, reads, budget)
