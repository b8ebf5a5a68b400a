"""What a deployment will cost, from its plan alone (nothing is allocated): bytes per rank and per node,
and the collectives each step runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from engram.config import EngramConfig, ParallelConfig
from engram.ngram.spec import ModelSpec
from engram.runtime.plan import DeploymentPlan, plan_deployment
from engram.runtime.shard import ShardFormat

OUT_BYTES = 2  # rows come out in bf16
ID_BYTES = 8


def per_rank(plan: DeploymentPlan) -> list[dict[str, int]]:
    rows = []
    gpu = plan.platform in ("cuda", "rocm")
    for rank in plan.ranks:
        size = plan.shard_bytes(rank)
        # device_cache_bytes of a host table's hottest rows live on the GPU too (never more than the shard)
        cache = min(plan.config.device_cache_bytes, size) if gpu and rank.placement != "device" else 0
        rows.append(
            {
                "rank": rank.rank,
                "tp_rank": rank.tp_rank,
                "dp_rank": rank.dp_rank,
                "node": rank.node,
                "device_bytes": size if rank.placement == "device" else cache,
                "pinned_host_bytes": size if rank.placement in ("pinned", "hugepages", "host") else 0,
                "shm_bytes": size if rank.placement == "shm" else 0,
                "node_copy_bytes": size if rank.placement == "node" else 0,  # mapped, loaded once per node
                "file_bytes": size if rank.placement == "file" else 0,  # mapped from the checkpoint
                # a RAM tier's rows over the file, this process's own (ram_cache_bytes, at most the shard)
                "ram_tier_bytes": min(plan.config.ram_cache_bytes, size) if rank.placement == "file" else 0,
            }
        )
    return rows


def per_node(plan: DeploymentPlan) -> list[dict[str, int]]:
    """Host bytes per node: private tables and RAM tiers add up per rank; a shared table counts once per
    node and TP shard, and that is also the /dev/shm the node needs; a file-backed shard counts once per node however
    many processes map it (the page cache's pages), and nothing is copied at start-up; a node copy
    (node_sharing) counts once per node and shard, whatever engines map it (with "numa", once per NUMA
    node holding GPUs: the plan does not know the machine's)."""
    nodes: dict[int, dict[str, int]] = {}
    seen_shm: set[Sequence[int]] = set()  # ranges: hashable, and equal when their members are
    seen: set[tuple[str, int, str, int, int]] = set()
    empty = {"host_bytes": 0, "shm_bytes": 0, "device_bytes": 0, "page_cache_bytes": 0, "node_copies": 0}
    for rank, row in zip(plan.ranks, per_rank(plan), strict=True):
        node = nodes.setdefault(rank.node, {"node": rank.node, **empty})
        node["host_bytes"] += row["pinned_host_bytes"] + row["ram_tier_bytes"]
        kind = "page_cache_bytes" if row["file_bytes"] else "node_copies" if row["node_copy_bytes"] else None
        for shard in rank.tables if kind else ():
            key = (kind or "", rank.node, shard.table, shard.row_start, shard.rows)
            if key in seen:
                continue
            seen.add(key)
            nbytes = ShardFormat(shard.rows, plan.spec.head_dim, plan.spec.dtype).nbytes
            if kind == "page_cache_bytes":
                node["page_cache_bytes"] += nbytes
            else:  # a copy in RAM, loaded by the first engine and mapped by the others
                node["node_copies"] += 1
                node["host_bytes"] += nbytes
        node["device_bytes"] += row["device_bytes"]
        if rank.shm_group is not None and rank.shm_group not in seen_shm:
            seen_shm.add(rank.shm_group)
            node["shm_bytes"] += row["shm_bytes"]
            node["host_bytes"] += row["shm_bytes"]
    return [nodes[n] for n in sorted(nodes)]


def collectives(plan: DeploymentPlan) -> list[dict[str, Any]]:
    layout = plan.spec.layout
    layers, columns, dim = len(layout.layer_ids), layout.columns, plan.spec.head_dim
    out: list[dict[str, Any]] = []
    tp = plan.parallel.tensor_parallel_size
    if plan.across_dp:
        out.append(
            {
                "op": "all_gather",
                "what": "row ids of every replica, once per step, padded with DEAD_ID",
                "group": "DP replicas at one TP rank",
                "group_size": plan.group_size // tp,
                "bytes_per_token": layers * columns * ID_BYTES,
            }
        )
    size = plan.group_size
    if size > 1:
        kind = plan.ranks[0].tables[0].kind
        group = f"TP x {plan.group_size // tp} DP ranks" if plan.across_dp else "TP ranks of a replica"
        what = "rows along heads" if kind == "head" else "rows, their bits summed as integers (one owner per row)"
        if plan.engine == "sglang":
            what = "rows, each row's owner giving it and the others zeros (SGLang's)"
        out.append(
            {
                "op": "all_gather" if kind == "head" else "all_reduce",
                "what": what + ", every layer",
                "group": group,
                "group_size": size,
                "bytes_per_token": layers * columns * dim * OUT_BYTES,
            }
        )
    return out


def staged_per_token(plan: DeploymentPlan) -> int:
    """With disk_offload, the bytes each rank reads from the checkpoint files (or the page cache, or its RAM
    tier) and copies to its GPU per token: every layer's full rows, as stored; 0 otherwise."""
    if not plan.config.disk_offload:
        return 0
    layout = plan.spec.layout
    return len(layout.layer_ids) * layout.columns * ShardFormat(1, plan.spec.head_dim, plan.spec.dtype).row_bytes


def summary(plan: DeploymentPlan) -> dict[str, Any]:
    return {
        "preset": plan.spec.name,
        "engram": msgspec.to_builtins(plan.config),
        "parallel": msgspec.to_builtins(plan.parallel),
        "platform": plan.platform,
        "placement": plan.ranks[0].placement,
        "shard_layout": plan.layout_name,
        "vllm_refusal": plan.vllm_refusal,
        "sharing_note": plan.sharing_note,
        "table_bytes": plan.spec.table_bytes,
        "per_rank": per_rank(plan),
        "per_node": per_node(plan),
        "collectives": collectives(plan),
        "staged_bytes_per_token": staged_per_token(plan),
        "copying_instead": copying_instead(plan),
    }


def copying_instead(plan: DeploymentPlan) -> dict[str, int]:
    """For file-backed tables: the host bytes per node (the first node) that the copying placements would
    fill from the checkpoint before the first lookup, private copies and one shared copy; {} otherwise."""
    if plan.ranks[0].placement != "file":
        return {}
    out = {}
    for name, shared in (("private", False), ("dp_shared_memory", True)):
        if shared and (plan.parallel.data_parallel_size < 2 or plan.engine == "sglang"):  # SGLang: no shared copy
            continue
        mode = replace_config(plan.config, embedding_across_dp=False, dp_shared_memory=shared)
        again = plan_deployment(plan.spec, mode, plan.parallel, plan.platform, plan.engine)
        out[name] = per_node(again)[0]["host_bytes"]
    return out


def host_bytes_by_dp(spec: ModelSpec, config: EngramConfig, tp: int, sizes: range) -> dict[str, list[int]]:
    """Host bytes of one node holding every replica, for each DP size: private tables, embedding_across_dp
    and dp_shared_memory (at DP 1 a shared table is just one private copy)."""
    modes = {
        "private": replace_config(config, embedding_across_dp=False, dp_shared_memory=False),
        "embedding_across_dp": replace_config(config, embedding_across_dp=True, dp_shared_memory=False),
        "dp_shared_memory": replace_config(config, embedding_across_dp=False, dp_shared_memory=True),
    }
    out: dict[str, list[int]] = {name: [] for name in modes}
    for dp in sizes:
        parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)
        for name, mode in modes.items():
            mode = mode if dp > 1 or name != "dp_shared_memory" else modes["private"]
            out[name].append(per_node(plan_deployment(spec, mode, parallel))[0]["host_bytes"])
    return out


def replace_config(config: EngramConfig, **fields: bool) -> EngramConfig:
    """Host tables loaded into memory, in the given sharing mode: what only tables read from the files
    have (file_backed, disk_offload and the budgets over them) goes with them, and node_sharing, which
    the sharing modes compared here replace."""
    return msgspec.structs.replace(
        config, cpu_offload=True, use_thp=False, file_backed=False, disk_offload=False, ram_cache_bytes=0,
        file_cache_bytes=0, node_sharing="off", **fields,
    )  # fmt: skip
