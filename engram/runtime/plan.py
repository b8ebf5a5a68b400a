"""Shard plans: who owns which rows, which ranks combine a lookup, which replicas share memory.

Plain data, computed without allocating anything, so `engram plan` can print a deployment of any size.
Global ranks are DP-major (rank = dp_rank * TP + tp_rank, as vLLM numbers them). The embedding group is
the TP ranks of a replica, or TP x DP with embedding_across_dp (shard = tp_rank * DP + dp_rank,
TP-major). DeepSeek tables split into whole heads per rank; Qwen tables, and DeepSeek groups larger than
the head count (which vLLM refuses), split into contiguous row ranges instead."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engram.config import EngramConfig, ParallelConfig
from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.placement.storage import Placement, ShardFormat, placement_for

ShardKind = Literal["head", "row"]
MAX_WORLD = 1 << 17  # TP x DP ranks: above the largest clusters; plans stay linear in the world size


@dataclass(frozen=True)
class TableShardPlan:
    """Rows [row_start, row_stop) of `table` (of `table_rows`); heads [head_start, head_stop) of each
    layer reading it for head shards, all heads for row shards."""

    table: str
    table_rows: int
    kind: ShardKind
    row_start: int
    row_stop: int
    head_start: int
    head_stop: int

    @property
    def rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True)
class RankPlan:
    rank: int
    tp_rank: int
    dp_rank: int
    node: int
    shard_index: int  # position in the embedding group, which orders the combine
    # Groups are ranges (O(1) memory each) or one tuple shared by every rank, so a plan costs memory
    # linear in the world size, never TP x world.
    embedding_group: Sequence[int]  # global ranks, in shard order
    dp_group: Sequence[int]  # global ranks of this TP rank's replicas: the id all-gather (across DP only)
    shm_group: Sequence[int] | None  # node-local replicas at this TP rank sharing one copy
    placement: Placement
    tables: tuple[TableShardPlan, ...]


@dataclass(frozen=True)
class DeploymentPlan:
    spec: ModelSpec
    config: EngramConfig
    parallel: ParallelConfig
    platform: str
    ranks: tuple[RankPlan, ...]

    @property
    def across_dp(self) -> bool:
        """Tables split over TP x DP. dp_shared_memory wins: its shards are TP-only and no DP collective
        may run, so embedding_across_dp has no effect beside it."""
        return (
            self.config.embedding_across_dp
            and self.parallel.data_parallel_size > 1
            and not self.config.dp_shared_memory
        )

    @property
    def group_size(self) -> int:
        return len(self.ranks[0].embedding_group)

    def shard_bytes(self, plan: RankPlan) -> int:
        return sum(ShardFormat(t.rows, self.spec.head_dim, self.spec.dtype).nbytes for t in plan.tables)


def head_range(index: int, size: int, heads: int) -> tuple[int, int]:
    per = -(-heads // size)
    return min(index * per, heads), min((index + 1) * per, heads)


def row_range(index: int, size: int, rows: int) -> tuple[int, int]:
    per = -(-rows // size)
    return min(index * per, rows), min((index + 1) * per, rows)


def table_shards(spec: ModelSpec, index: int, size: int) -> tuple[TableShardPlan, ...]:
    layout = spec.layout
    columns = layout.columns
    use_heads = spec.family == "deepseek" and size <= columns
    out = []
    for table, (name, rows) in enumerate(zip(spec.table_names(), layout.table_rows, strict=True)):
        if use_heads:
            start, stop = head_range(index, size, columns)
            layer = layout.table_of_layer.index(table)
            offsets = layout.offsets[layer].reshape(-1)
            primes = layout.primes[layer].reshape(-1)
            first = int(offsets[start]) if start < columns else rows
            last = int(offsets[stop - 1] + primes[stop - 1]) if stop > start else first
            out.append(TableShardPlan(name, rows, "head", first, last, start, stop))
        else:
            first, last = row_range(index, size, rows)
            out.append(TableShardPlan(name, rows, "row", first, last, 0, columns))
    return tuple(out)


def plan_deployment(
    spec: ModelSpec, config: EngramConfig, parallel: ParallelConfig, platform: str = "cuda"
) -> DeploymentPlan:
    config = config.resolve_dp_shared_memory(parallel)  # a null one, as vLLM 0.33 resolves it
    config.verify_parallel_config(parallel)
    tp, dp = parallel.tensor_parallel_size, parallel.data_parallel_size
    local = parallel.data_parallel_size_local or dp
    if dp % local:
        raise EngramError(
            f"data_parallel_size {dp} is not a multiple of data_parallel_size_local {local} (replicas per node)"
        )
    if tp * dp > MAX_WORLD:
        raise EngramError(
            f"TP {tp} x DP {dp} = {tp * dp:,} ranks is more than any deployment has (at most {MAX_WORLD:,}); check the parallel sizes"
        )
    across = config.embedding_across_dp and dp > 1 and not config.dp_shared_memory
    placement = placement_for(config, platform)

    def rank_of(tp_rank: int, dp_rank: int) -> int:
        return dp_rank * tp + tp_rank

    everyone = tuple(rank_of(t, d) for t in range(tp) for d in range(dp)) if across else ()
    shards: dict[tuple[int, int], tuple[TableShardPlan, ...]] = {}  # equal shard indices share one plan
    ranks = []
    for dp_rank in range(dp):
        for tp_rank in range(tp):
            node = dp_rank // local
            if across:
                index, size = tp_rank * dp + dp_rank, tp * dp
                group: Sequence[int] = everyone
            else:
                index, size = tp_rank, tp
                group = range(rank_of(0, dp_rank), rank_of(0, dp_rank) + tp)
            shm = None
            if config.dp_shared_memory:
                shm = range(rank_of(tp_rank, node * local), rank_of(tp_rank, (node + 1) * local), tp)
            if (index, size) not in shards:
                shards[(index, size)] = table_shards(spec, index, size)
            ranks.append(
                RankPlan(
                    rank=rank_of(tp_rank, dp_rank),
                    tp_rank=tp_rank,
                    dp_rank=dp_rank,
                    node=node,
                    shard_index=index,
                    embedding_group=group,
                    dp_group=range(tp_rank, rank_of(tp_rank, dp), tp),
                    shm_group=shm,
                    placement=placement,
                    tables=shards[(index, size)],
                )
            )
    return DeploymentPlan(spec, config, parallel, platform, tuple(ranks))
