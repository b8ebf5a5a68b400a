"""The readers of a table in memory (lookup/__init__.py): the op's gather for the ids' device, alone
(Reader) or through the table's DeviceTier (TieredReader)."""

from __future__ import annotations

import torch

from engram.runtime.lookup.gathers import Gathers, TierGathers
from engram.runtime.shard import Output, TableShard
from engram.runtime.tiers.device import DeviceTier


class Reader(Gathers):
    """Reads a shard of a table of `table_rows` rows in memory, by gather alone."""

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """Table.lookup's rows, its arguments checked."""
        return self.gathered(ids, out, kind, check)

    def prefetch(self, ids: torch.Tensor) -> int:
        """Bytes asked of storage ahead of a lookup of `ids`: none for rows in memory."""
        return 0


class TieredReader(TierGathers):
    """Reads a shard in memory through its DeviceTier: the tier sees every lookup's ids (its next
    refresh chooses from them) and serves its hits."""

    tier: DeviceTier

    def __init__(self, shard: TableShard, table_rows: int, tier: DeviceTier) -> None:
        super().__init__(shard, table_rows, tier)

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        self.tier.sees(ids)
        return self.gathered(ids, out, kind, check)

    def prefetch(self, ids: torch.Tensor) -> int:
        return 0
