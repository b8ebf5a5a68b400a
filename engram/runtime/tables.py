"""All tables of a model, allocated and loaded in one call (whole tables; the sharded plans build on it)."""

from __future__ import annotations

from collections.abc import Callable

from engram.ngram.spec import ModelSpec
from engram.runtime.dist import Group
from engram.runtime.loader import Checkpoint, load_shards
from engram.runtime.memory import pss
from engram.runtime.registration import CudaRuntime
from engram.runtime.storage import Placement, ShardFormat, TableShard, allocate


def table_rows(spec: ModelSpec) -> dict[str, int]:
    return dict(zip(spec.table_names(), spec.layout.table_rows, strict=True))


def open_tables(
    spec: ModelSpec,
    checkpoint: Checkpoint,
    placement: Placement,
    *,
    group: Group | None = None,
    runtime: CudaRuntime | None = None,
    progress: bool = True,
    on_bytes: Callable[[int], None] | None = None,
) -> list[TableShard]:
    """Allocate every table of `spec` where `placement` says and load it from `checkpoint`. `group` is
    the node-local DP group, needed (and used for loading) only with placement shm."""
    shared = group if placement == "shm" else None
    shards = [
        allocate(name, ShardFormat(rows, spec.head_dim, spec.dtype), placement, group=shared, runtime=runtime)
        for name, rows in table_rows(spec).items()
    ]
    load_shards(shards, table_rows(spec), checkpoint, group=shared, progress=progress, on_bytes=on_bytes)
    return shards


def tables_pss(shards: list[TableShard]) -> int:
    """Proportional set size of the tables' memory in this process, read per mapping from smaps, so the
    interpreter's own memory is not counted (tables in RAM without a mapping of ours, i.e. device
    placement on the CPU platform, are measured over their tensors' address ranges)."""
    total = 0
    for shard in shards:
        if shard.mapping is not None:
            total += pss(shard.mapping.addr, shard.mapping.length)
        elif shard.weight.device.type == "cpu":
            for tensor in (shard.weight, shard.scale):
                if tensor is not None and tensor.numel():
                    total += pss(tensor.data_ptr(), tensor.numel() * tensor.element_size())
    return total
