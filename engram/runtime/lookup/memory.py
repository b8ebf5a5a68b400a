"""The reader of a table in memory (lookup/__init__.py): the op's gather for the ids' device, through the
table's DeviceTier when it has one."""

from __future__ import annotations

import torch

from engram.ops.devices import ensure_kernels
from engram.runtime.lookup.gathers import Gathers
from engram.runtime.placement.residency import DiskReads
from engram.runtime.shard import PACKED, Output, TableShard
from engram.runtime.tiers.open import Tier


class Reader(Gathers):
    """Reads a shard of a table of `table_rows` rows in memory (module docstring); `reads` counts what a
    file-backed table's reads bring in from storage."""

    def __init__(self, shard: TableShard, table_rows: int, tier: Tier | None, reads: DiskReads) -> None:
        super().__init__(shard, table_rows, tier)
        self.reads = reads

    def lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """Table.lookup's rows, its arguments checked."""
        if self.tier is not None:
            self.tier.sees(ids)
        return self.gathered(ids, out, kind, check)

    def prefetch(self, ids: torch.Tensor) -> int:
        """Bytes asked of storage ahead of a lookup of `ids`: none for rows in memory."""
        return 0

    def gathered(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        """The rows by gather (the tier's hits from the tier), into `out` when given; for a GPU's ids over
        memory the GPU cannot read (Shard.staged), gathered on host threads and copied to it once."""
        ensure_kernels(ids.device)
        if self.shard.staged and ids.is_cuda:  # host threads read the file's pages; one copy to the GPU
            host = self.rows(ids.cpu(), kind, None if check is None else check.cpu())
            rows = host.pin_memory().to(ids.device, non_blocking=True)
            return rows if out is None else out.copy_(rows)
        if out is not None and self.tier is None and kind != PACKED:
            return self.call(ids, out, check).run()
        rows = self.rows(ids, kind, check)
        return rows if out is None else out.copy_(rows)
