"""A rank's tables, allocated and loaded in one call: whole tables by default, or the shards a plan gives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from engram.memory.registration import CudaRuntime
from engram.memory.smaps import pss
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint, check_hash_buffers, load_shards
from engram.runtime.dist import Group
from engram.runtime.plan import TableShardPlan, table_shards
from engram.runtime.shard import Placement, ShardFormat, TableShard
from engram.runtime.table import open_shard


def whole_tables(spec: ModelSpec) -> tuple[TableShardPlan, ...]:
    """Plans for every table in full: what one rank alone holds."""
    return table_shards(spec, 0, 1)


def allocate_shards(
    spec: ModelSpec,
    plans: Sequence[TableShardPlan],
    placement: Placement,
    *,
    group: Group | None = None,
    runtime: CudaRuntime | None = None,
    checkpoint: Checkpoint | None = None,
    **node: Any,
) -> list[TableShard]:
    """Storage for each planned shard (engram.runtime.table.open_shard); `group` (the node-local DP group)
    is used with placement shm only, `checkpoint` with placements file and node, `node` (sharing, device,
    progress) with placement node."""
    shared = group if placement == "shm" else None
    return [
        open_shard(
            p.table,
            ShardFormat(p.rows, spec.head_dim, spec.dtype),
            placement,
            row_start=p.row_start,
            table_rows=p.table_rows,
            checkpoint=checkpoint,
            group=shared,
            runtime=runtime,
            **node,
        )
        for p in plans
    ]


def open_tables(
    spec: ModelSpec,
    checkpoint: Checkpoint,
    placement: Placement,
    *,
    plans: Sequence[TableShardPlan] | None = None,
    group: Group | None = None,
    runtime: CudaRuntime | None = None,
    progress: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    sharing: str = "node",
    node_dir: str | None = None,
    device: torch.device | None = None,
) -> list[TableShard]:
    """Allocate the planned shards (default: every table whole) where `placement` says and load them
    from `checkpoint`. With placement shm, `group` shares them and only its leader writes; with placement
    node (`sharing`: "node" or "numa"; `node_dir`: where the node's engines meet; `device`: the GPU they
    are read from) each is the node's copy, attached, or loaded here when no process of this user on the
    node holds it."""
    plans = whole_tables(spec) if plans is None else plans
    check_hash_buffers(spec, checkpoint)
    node = (
        {"sharing": sharing, "node_dir": node_dir, "device": device, "progress": progress}
        if placement == "node"
        else {}
    )
    shards = allocate_shards(spec, plans, placement, group=group, runtime=runtime, checkpoint=checkpoint, **node)
    if placement in ("file", "node"):  # nothing to copy: views of the checkpoint's files, or node copies loaded
        return shards
    rows = {p.table: p.table_rows for p in plans}
    load_shards(
        shards, rows, checkpoint, group=group if placement == "shm" else None, progress=progress, on_bytes=on_bytes
    )
    return shards


def tables_pss(shards: list[TableShard]) -> int:
    """Proportional set size of the tables' memory in this process, read per mapping from smaps, so the
    interpreter's own memory is not counted (tables in RAM without a mapping of their own, device tensors
    on the CPU platform and file-backed views, are measured over their tensors' address ranges)."""
    total = 0
    for shard in shards:
        if shard.mapping is not None:
            total += pss(shard.mapping.addr, shard.mapping.length)
        elif shard.weight.device.type == "cpu":
            for tensor in (shard.weight, shard.scale):
                if tensor is not None and tensor.numel():
                    total += pss(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    return total
