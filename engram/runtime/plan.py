"""Shard plans: who owns which rows, which ranks combine a lookup, which replicas share memory.

Plain data, computed without allocating anything, so `engram plan` can print a deployment of any size.
Global ranks are DP-major (rank = dp_rank * TP + tp_rank, as vLLM numbers them). An embedding group is
the TP ranks of a block of consecutive DP replicas. With shard_layout "vllm" (vLLM 0.33's layout, the
default) a DeepSeek block is the node-local Engram DP group (EDP, engram_dp_size) and shards go TP-major
(shard = tp_rank * EDP + dp_rank in block); a Qwen block is all of DP with embedding_across_dp, DP-major
(shard = dp_rank * TP + tp_rank, vLLM's ETP). With "replica" (the seed's) a block is one replica, or
all of DP with embedding_across_dp, TP-major. DeepSeek tables split into whole heads per rank; Qwen
tables, and DeepSeek groups larger than the head count (which vLLM refuses), into contiguous row ranges.

Inside SGLang (engine "sglang") its own layout holds: each DP replica a copy of the tables over its TP
ranks (one per node with node_sharing or file_backed, as above); DeepSeek's rows split on the layer's hash
columns where their count divides TP, else into equal row ranges (SGLang's shard_range); Qwen4Exp's
vocabulary into VocabParallelEmbedding's shards, padded to 64 rows (times TP where 64 does not divide)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec

from engram.config import EngramConfig, ParallelConfig
from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.placement.storage import placement_for
from engram.runtime.shard import Placement, ShardFormat

ShardKind = Literal["head", "row"]
Engine = Literal["vllm", "sglang"]
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
    vllm_refusal: str | None = None  # why vLLM 0.33 would refuse this layout (engram serves it anyway)
    sharing_note: str | None = None  # why a dp_shared_memory that is on shares nothing in this layout
    engine: Engine = "vllm"

    @property
    def across_dp(self) -> bool:
        """Embedding groups span DP replicas, whose ids are gathered every step (dp_group). Shared tables
        rule it out: their shards are TP-only and no DP collective may run (a Qwen ETP group over DP shares
        nothing, see sharing_note)."""
        return self.group_size > self.parallel.tensor_parallel_size

    @property
    def layout_name(self) -> str:
        """Which per-rank layout this is, in words for `engram plan`."""
        if self.engine == "sglang":
            return "sglang (SGLang 0.5.23's: each DP replica's copy split over its TP ranks)"
        if self.config.disk_offload:
            return "vLLM 0.34's disk offload (every rank reads full rows of the whole table from the checkpoint files: no ETP sharding)"
        if self.config.shard_layout == "replica":
            return "replica (the seed's: a private TP-sharded copy per DP replica)"
        return "vllm (vLLM 0.33's per-rank layout)"

    @property
    def group_size(self) -> int:
        return len(self.ranks[0].embedding_group)

    def pinned_bytes_per_node(self) -> int:
        """Bytes of private host tables (pinned, huge pages, host) on the busiest node."""
        nodes: dict[int, int] = {}
        for rank in self.ranks:
            if rank.placement in ("pinned", "hugepages", "host"):
                nodes[rank.node] = nodes.get(rank.node, 0) + self.shard_bytes(rank)
        return max(nodes.values(), default=0)

    def shard_bytes(self, plan: RankPlan) -> int:
        return sum(ShardFormat(t.rows, self.spec.head_dim, self.spec.dtype).nbytes for t in plan.tables)


def head_range(index: int, size: int, heads: int) -> tuple[int, int]:
    per = -(-heads // size)
    return min(index * per, heads), min((index + 1) * per, heads)


def row_range(index: int, size: int, rows: int) -> tuple[int, int]:
    per = -(-rows // size)
    return min(index * per, rows), min((index + 1) * per, rows)


def table_shards(spec: ModelSpec, index: int, size: int, rows_only: bool = False) -> tuple[TableShardPlan, ...]:
    """Shard `index` of `size`: whole heads where the family and count allow, else (or with `rows_only`)
    contiguous rows."""
    layout = spec.layout
    columns = layout.columns
    use_heads = spec.family == "deepseek" and size <= columns and not rows_only
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


def sglang_table_shards(spec: ModelSpec, tp_rank: int, tp: int) -> tuple[TableShardPlan, ...]:
    """TP rank `tp_rank`'s rows of each table inside SGLang (module docstring)."""
    layout, out = spec.layout, []
    for table, (name, rows) in enumerate(zip(spec.table_names(), layout.table_rows, strict=True)):
        if spec.family == "deepseek":
            layer = layout.table_of_layer.index(table)
            bounds = [*layout.offsets[layer].reshape(-1).tolist(), rows]
            per = (len(bounds) - 1) // tp if (len(bounds) - 1) % tp == 0 else 0
            first, last = (
                (bounds[tp_rank * per], bounds[(tp_rank + 1) * per])
                if per
                else (rows * tp_rank // tp, rows * (tp_rank + 1) // tp)
            )
        else:
            padding = 64 if -(-rows // 64) * 64 % tp == 0 else 64 * tp
            per = -(-rows // padding) * padding // tp
            first, last = min(tp_rank * per, rows), min((tp_rank + 1) * per, rows)
        out.append(TableShardPlan(name, rows, "row", first, last, 0, layout.columns))
    return tuple(out)


def engram_dp_size(spec: ModelSpec, config: EngramConfig, parallel: ParallelConfig) -> int:
    """vLLM 0.33's node-local Engram DP group size (EDP) for DeepSeek V4.1 (initialize_model_parallel):
    all of DP for GPU tables at TP 1 with embedding_across_dp (peers' memory over one NVLink domain),
    else the gcd of DP and the replicas per node; 1 with elastic EP, for Qwen and for shared tables."""
    dp = parallel.data_parallel_size
    if spec.family != "deepseek" or parallel.enable_elastic_ep or config.dp_shared_memory:
        return 1
    if not config.cpu_offload and config.embedding_across_dp and parallel.tensor_parallel_size == 1:
        return dp
    return math.gcd(dp, parallel.data_parallel_size_local or dp)


def vllm_refusal(spec: ModelSpec, size: int) -> str | None:
    """Why vLLM 0.33 would not build this shard layout (engram falls back to row shards there)."""
    columns = spec.layout.columns
    if spec.family == "deepseek" and size > 1 and (size - 1) * -(-columns // size) >= columns:
        return f"Engram sharding leaves ranks without hash heads: {columns} heads over {size} shards"
    rows = next((r for r in spec.layout.table_rows if r % size), None)
    if spec.family == "qwen" and rows is not None:
        return f"{rows:,} table rows do not divide evenly over {size} ETP ranks"
    return None


def sizes_of(parallel: ParallelConfig) -> tuple[int, int, int]:
    """(TP, DP, DP replicas per node) of a deployment any plan can be made of, or the reason it cannot."""
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
    return tp, dp, local


def plan_deployment(
    spec: ModelSpec, config: EngramConfig, parallel: ParallelConfig, platform: str = "cuda", engine: Engine = "vllm"
) -> DeploymentPlan:
    """Who holds which rows in `engine`'s layout (the module docstring), with what placement. The config
    is checked against the model and platform first, as `engram validate` checks a deployment (DeepSeek
    V4.1 with disk_offload is refused here too)."""
    config.verify_model_config(spec.model_config(), platform)
    if engine == "sglang":
        return _sglang_plan(spec, config, parallel, platform)
    config = config.resolve_dp_shared_memory(parallel)  # a null one, as vLLM 0.33 resolves it
    config.verify_parallel_config(parallel)
    if config.disk_offload:
        return _disk_offload_plan(spec, config, parallel, platform)
    tp, dp, local = sizes_of(parallel)
    # The DP ranks one embedding group spans (a block of consecutive ones), and whether the group's shard
    # index puts DP first (vLLM's Qwen ETP: dp * TP + tp) or TP first (tp * span + dp).
    if config.shard_layout == "vllm" and spec.family == "qwen":
        # vLLM 0.33 sizes Qwen's ETP group by get_parallel_size, whatever dp_shared_memory or file_backed say
        span, dp_major = config.get_parallel_size(parallel) // tp, True
    elif (
        config.dp_shared_memory
        or config.node_sharing != "off"
        or (config.file_backed and config.shard_layout == "vllm")
    ):
        span, dp_major = 1, False  # one copy per node already (node copies', or file-backed: the page cache's)
    elif config.shard_layout == "replica":
        span, dp_major = (dp if config.embedding_across_dp else 1), False
    else:
        span, dp_major = engram_dp_size(spec, config, parallel), False
    # Replicas share a copy only where they hold the same rows: not in an ETP group spread over DP.
    shared = bool(config.dp_shared_memory) and span == 1 and config.node_sharing == "off"  # else: node copies
    note = None
    if config.dp_shared_memory and not shared and config.node_sharing == "off":  # node copies serve replicas too
        note = (
            "dp_shared_memory shares nothing here: Qwen4Exp's ETP group spreads one copy of the tables over the "
            f"{span} replicas (embedding_across_dp), so each holds rows of its own, privately"
        )
        config_for_placement = msgspec.structs.replace(config, dp_shared_memory=False)
    else:
        config_for_placement = config
    # vLLM's GPU tables at TP 1 over EDP > 1 split rows (each rank reads its peers' memory), not heads
    peer_rows = config.shard_layout == "vllm" and spec.family == "deepseek" and not config.cpu_offload
    peer_rows = peer_rows and tp == 1 and span > 1
    placement = placement_for(config_for_placement, platform)

    def rank_of(tp_rank: int, dp_rank: int) -> int:
        return dp_rank * tp + tp_rank

    shards: dict[tuple[int, int], tuple[TableShardPlan, ...]] = {}  # equal shard indices share one plan
    groups: dict[int, tuple[int, ...]] = {}  # one tuple per block of DP ranks, shared by its members
    ranks = []
    for dp_rank in range(dp):
        block, within = divmod(dp_rank, span)
        for tp_rank in range(tp):
            node = dp_rank // local
            index = within * tp + tp_rank if dp_major else tp_rank * span + within
            size = tp * span
            if block not in groups:
                members = [(t, block * span + d) for t in range(tp) for d in range(span)]
                order = sorted(members, key=lambda m: (m[1], m[0])) if dp_major else members
                groups[block] = tuple(rank_of(t, d) for t, d in order)
            shm = None
            if shared:
                shm = range(rank_of(tp_rank, node * local), rank_of(tp_rank, (node + 1) * local), tp)
            if (index, size) not in shards:
                shards[(index, size)] = table_shards(spec, index, size, peer_rows)
            ranks.append(
                RankPlan(
                    rank=rank_of(tp_rank, dp_rank),
                    tp_rank=tp_rank,
                    dp_rank=dp_rank,
                    node=node,
                    shard_index=index,
                    embedding_group=groups[block],
                    dp_group=range(rank_of(tp_rank, block * span), rank_of(tp_rank, (block + 1) * span), tp),
                    shm_group=shm,
                    placement=placement,
                    tables=shards[(index, size)],
                )
            )
    refusal = vllm_refusal(spec, tp * span) if config.shard_layout == "vllm" and not peer_rows else None
    return DeploymentPlan(spec, config, parallel, platform, tuple(ranks), refusal, note)


def _disk_offload_plan(
    spec: ModelSpec, config: EngramConfig, parallel: ParallelConfig, platform: str
) -> DeploymentPlan:
    """vLLM 0.34's disk offload of Qwen4Exp's PLE tables: no table is allocated, and every rank reads its
    tokens' full rows of the whole table from the checkpoint files each step (no ETP sharding, so no
    collective): vLLM's one read per row, or with engram's section engram's file-backed table over the
    same files (its page cache shared by the node's processes, file_cache_bytes, a RAM tier)."""
    tp, dp, local = sizes_of(parallel)
    whole = table_shards(spec, 0, 1)
    ranks = tuple(
        RankPlan(
            rank=r, tp_rank=r % tp, dp_rank=r // tp, node=r // tp // local, shard_index=0,
            embedding_group=range(r, r + 1), dp_group=range(r, r + 1), shm_group=None, placement="file",
            tables=whole,
        )
        for r in range(tp * dp)
    )  # fmt: skip
    return DeploymentPlan(spec, config, parallel, platform, ranks)


def _sglang_plan(spec: ModelSpec, config: EngramConfig, parallel: ParallelConfig, platform: str) -> DeploymentPlan:
    """plan_deployment inside SGLang: a copy per DP replica over its TP ranks (module docstring), placed as
    the plugin places it (no replicas' group to share a copy in: node_sharing shares one per node)."""
    tp, dp, local = sizes_of(parallel)
    placement = placement_for(config, platform, shareable=False)
    shards = [sglang_table_shards(spec, tp_rank, tp) for tp_rank in range(tp)]
    ranks = tuple(
        RankPlan(
            rank=dp_rank * tp + tp_rank, tp_rank=tp_rank, dp_rank=dp_rank, node=dp_rank // local,
            shard_index=tp_rank, embedding_group=range(dp_rank * tp, (dp_rank + 1) * tp),
            dp_group=range(dp_rank * tp + tp_rank, dp_rank * tp + tp_rank + 1), shm_group=None,
            placement=placement, tables=shards[tp_rank],
        )
        for dp_rank in range(dp)
        for tp_rank in range(tp)
    )  # fmt: skip
    return DeploymentPlan(spec, config, parallel, platform, ranks, engine="sglang")
