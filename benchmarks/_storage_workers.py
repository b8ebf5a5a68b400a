"""Per-rank functions of bench_storage.py (spawned processes import them by name)."""

from __future__ import annotations

import torch

from engram.ngram.spec import ModelSpec
from engram.ops import gather
from engram.runtime import dist as edist
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.rank_tables import open_tables, tables_pss
from engram.runtime.shard import Placement


def replica_pss(rank: int, world: int, spec: ModelSpec, checkpoint: str, placement: Placement) -> int:
    group = edist.new_group(list(range(world)), "bench replicas")
    shards = open_tables(spec, Checkpoint(checkpoint), placement, group=group, progress=False)
    if placement == "file":  # a mapping costs only the pages read: read every row, the worst case
        for shard in shards:
            ids = torch.arange(shard.row_start, shard.row_stop)
            gather(shard.weight, None, ids, shard.row_start, shard.row_stop, shard.weight.dtype)
            if shard.scale is not None:
                gather(shard.scale.view(torch.uint8), None, ids, shard.row_start, shard.row_stop, torch.uint8)
    edist.barrier(group, "loaded")
    measured = tables_pss(shards)
    edist.barrier(group, "measured")
    return measured
