"""The gathers a lookup runs (engram.ops.GatherCall) over a shard's rows or a tier's: in the output kind
asked for (a float dtype, the rows as stored, or PACKED: each stored part's bytes), and a call's hits read
from a tier's rows (hot_rows.cached_gather). Every reader stands on these: Gathers for a table alone,
TierGathers for a table through its tier."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engram.ops import GatherCall, use_sorted
from engram.ops.devices import ensure_kernels
from engram.runtime.shard import PACKED, Output, TableShard
from engram.runtime.tiers.hot_rows import HotRows, cached_gather
from engram.runtime.tiers.open import Tier

Gather = Callable[["Gathers", torch.Tensor, torch.Tensor | None, Output, torch.Tensor | None], torch.Tensor]


class Gathers:
    """The gathers of one shard of a table of `table_rows` rows. How `gathered` reads is chosen once: for
    a shard the GPU cannot read (Shard.staged), a GPU's ids are gathered on host threads and copied."""

    def __init__(self, shard: TableShard, table_rows: int) -> None:
        self.shard, self.table_rows = shard, table_rows
        # the class's function, not a bound method: a reader holding itself would keep the shard's
        # mappings until the garbage collector ran
        self._gather: Gather = type(self).staged if shard.staged else type(self).into

    def gathered(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """The rows by gather as chosen at open (`into` or `staged`), into `out` when given."""
        return self._gather(self, ids, out, kind, check)

    def rows(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> torch.Tensor:
        """The rows of `ids` in `kind` (every stored part's, side by side, for PACKED)."""
        return self.joined([call.run() for call in self.calls(ids, kind, check)])

    @staticmethod
    def joined(parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def into(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """The rows by gather, straight into `out` when given."""
        ensure_kernels(ids.device)
        if out is not None and kind != PACKED:
            return self.call(ids, out, check).run()
        rows = self.rows(ids, kind, check)
        return rows if out is None else out.copy_(rows)

    def staged(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """`into`, but a GPU's ids are gathered on host threads (the GPU cannot read these pages) and the
        rows copied to it once."""
        if not ids.is_cuda:
            return self.into(ids, out, kind, check)
        ensure_kernels(ids.device)
        host = self.rows(ids.cpu(), kind, None if check is None else check.cpu())
        rows = host.pin_memory().to(ids.device, non_blocking=True)
        return rows if out is None else out.copy_(rows)

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

    def gather(self, ids: torch.Tensor, kind: Output) -> torch.Tensor:
        """Rows of `ids` in `kind` read from the table alone."""
        return self.joined([call.run() for call in self.calls(ids, kind, None)])


class TierGathers(Gathers):
    """The gathers of a shard through its tier: a call's hits read from the tier's rows, its misses from
    the table, and the tier's rows read by slot."""

    def __init__(self, shard: TableShard, table_rows: int, tier: Tier) -> None:
        super().__init__(shard, table_rows)
        self.tier = tier

    def rows(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> torch.Tensor:
        """The rows of `ids`, the tier's hits from it; a PACKED lookup gathers twice and counts once."""
        return self.joined([self.cached(call, counted=not i) for i, call in enumerate(self.calls(ids, kind, check))])

    def into(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        ensure_kernels(ids.device)
        rows = self.rows(ids, kind, check)
        return rows if out is None else out.copy_(rows)

    def cached(self, call: GatherCall, *, counted: bool) -> torch.Tensor:
        """`call` with the tier's hits read from it; `counted`: its ids are added to the tier's counters."""
        counts = self.tier.counts if counted else None
        return cached_gather(self.hot(call), call, counts, (self.shard.row_start, self.shard.row_stop))

    def hot(self, call: GatherCall) -> HotRows:
        """The tier's rows in the form `call` reads the table's: as stored, raw bytes, or with scales."""
        cache = self.tier.rows
        if call.weight is self.shard.weight:
            return cache if call.scale is not None else cache.view(cache.weight, None)
        stored = cache.weight if call.weight.data_ptr() == self.shard.weight.data_ptr() else cache.scale
        assert stored is not None
        return cache.view(stored.view(torch.uint8), None)

    def from_tier(self, slots: torch.Tensor, kind: Output, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tier's rows in `slots` (FREE: zeros), into `out` when given."""
        parts = []
        for call in self.calls(slots, kind, None):
            hot = self.hot(call)
            parts.append(
                GatherCall(
                    hot.weight, hot.scale, slots, 0, hot.weight.shape[0], call.out_dtype, table_scale=call.table_scale
                ).run()
            )
        rows = self.joined(parts)
        return rows if out is None else out.copy_(rows)
