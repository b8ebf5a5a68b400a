"""The gathers a lookup runs (engram.ops.GatherCall) over a shard's rows or a tier's: in the output kind
asked for (a float dtype, the rows as stored, or PACKED: each stored part's bytes), and a call's hits read
from a tier's rows (hot_rows.cached_gather). Every reader stands on these."""

from __future__ import annotations

import torch

from engram.ops import GatherCall, use_sorted
from engram.runtime.shard import PACKED, Output, TableShard
from engram.runtime.tiers.hot_rows import HotRows, cached_gather
from engram.runtime.tiers.open import Tier


class Gathers:
    """The gathers of one shard of a table of `table_rows` rows, and of its tier's rows."""

    def __init__(self, shard: TableShard, table_rows: int, tier: Tier | None) -> None:
        self.shard, self.table_rows, self.tier = shard, table_rows, tier

    def rows(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> torch.Tensor:
        parts = [
            call.run() if self.tier is None else self.cached(call, counted=not i)  # a packed lookup counts once
            for i, call in enumerate(self.calls(ids, kind, check))
        ]
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def calls(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> list[GatherCall]:
        """The gathers of `ids` in `kind` from the table: one, or for PACKED one per stored part (the
        weight's bytes, then the scales')."""
        if kind != PACKED:
            return [self.call(ids, kind, check)]
        sort = self.sorted(ids)
        return [
            GatherCall(
                part.view(torch.uint8), None, ids, self.shard.row_start, self.table_rows, torch.uint8, sort, check
            )
            for part in (self.shard.weight, self.shard.scale)
            if part is not None
        ]

    def call(self, ids: torch.Tensor, out: torch.Tensor | torch.dtype, check: torch.Tensor | None) -> GatherCall:
        shard = self.shard
        dtype = out.dtype if isinstance(out, torch.Tensor) else out
        if dtype == shard.weight.dtype:  # as stored: no scale applied (Qwen4Exp's fp8 rows, say)
            return GatherCall(shard.weight, None, ids, shard.row_start, self.table_rows, out, self.sorted(ids), check)
        table_scale = None if shard.table_scale is None else float(shard.table_scale[0])  # a loader may set it late
        return GatherCall(
            shard.weight, shard.scale, ids, shard.row_start, self.table_rows, out, self.sorted(ids), check, table_scale
        )

    def sorted(self, ids: torch.Tensor) -> bool:
        return use_sorted(ids.numel(), self.shard.weight, ids.device)

    def cached(self, call: GatherCall, *, counted: bool) -> torch.Tensor:
        """`call` with the tier's hits read from it; `counted`: its ids are added to the tier's counters
        (a packed lookup gathers twice, and counts once)."""
        tier = self.tier
        assert tier is not None
        counts = tier.counts if counted else None
        return cached_gather(self.hot(tier.rows, call), call, counts, (self.shard.row_start, self.shard.row_stop))

    def hot(self, cache: HotRows, call: GatherCall) -> HotRows:
        """The tier's rows in the form `call` reads the table's: as stored, raw bytes, or with scales."""
        if call.weight is self.shard.weight:
            return cache if call.scale is not None else cache.view(cache.weight, None)
        stored = cache.weight if call.weight.data_ptr() == self.shard.weight.data_ptr() else cache.scale
        assert stored is not None
        return cache.view(stored.view(torch.uint8), None)

    def gather(self, ids: torch.Tensor, kind: Output, *, from_tier: bool = False) -> torch.Tensor:
        """Rows of `ids` in `kind` read from the table alone, or (`from_tier`) the tier's rows in slots `ids`."""
        parts = []
        for call in self.calls(ids, kind, None):
            if from_tier:
                assert self.tier is not None
                hot = self.hot(self.tier.rows, call)
                call = GatherCall(
                    hot.weight, hot.scale, ids, 0, hot.weight.shape[0], call.out_dtype, table_scale=call.table_scale
                )
            parts.append(call.run())
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def from_tier(self, slots: torch.Tensor, kind: Output, out: torch.Tensor | None) -> torch.Tensor:
        """The tier's rows in `slots` (FREE: zeros), into `out` when given."""
        rows = self.gather(slots, kind, from_tier=True)
        return rows if out is None else out.copy_(rows)
