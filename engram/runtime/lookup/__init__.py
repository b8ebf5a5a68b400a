"""How a table's rows are read, one reader per lookup mode, chosen when the table opens and again when it
gets or loses a tier (reader_for); Table.lookup delegates to it, and each reader owns its whole lookup:

- Reader (memory.py): a table in memory (device tensor, host memory the GPU reads over UVA, huge pages,
  a node copy or a replicas' memfd), gathered by the op for the ids' device; through its DeviceTier if it
  has one; for a GPU's ids over memory the GPU cannot read, gathered on host threads and copied once.
- FileReader (file.py): a checkpoint file's own pages. On disk, the pages of the rows to read are asked
  for first (readahead per lookup, within file_cache_bytes), and a prefill's ids read in batches.
- RamTierReader (ram_tier.py): a file on disk with a RamTier: the rows it holds come from it, the rows it
  misses are read into it (from the disk past the page cache where that works and memory is short) and
  from it.

The gathers all of them build (gathers.py) and the spread of distinct rows back to their ids (spread.py)
are shared parts."""

from __future__ import annotations

from engram.runtime.lookup.file import FileReader
from engram.runtime.lookup.memory import Reader
from engram.runtime.lookup.ram_tier import RamTierReader
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.shard import TableShard
from engram.runtime.tiers.open import Tier
from engram.runtime.tiers.ram import RamTier


def reader_for(
    shard: TableShard, table_rows: int, tier: Tier | None, budget: ResidentBudget | None, reads: DiskReads
) -> Reader:
    """The reader of this table's mode (module docstring)."""
    if not shard.files:
        return Reader(shard, table_rows, tier, reads)
    if isinstance(tier, RamTier):
        return RamTierReader(shard, table_rows, tier, reads, budget)
    return FileReader(shard, table_rows, tier, reads, budget)
