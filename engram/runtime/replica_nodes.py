"""Which data-parallel replicas share a node, as the job really runs, not as configured: the ranks
exchange their node identity (ENGRAM_NODE_ID, else the boot id), and for dp_shared_memory the replicas
at one TP rank on one node share a table. When the nodes hold equal, contiguous blocks of replicas that is
data_parallel_size_local, whatever the config said; when they do not line up, every replica keeps a
private copy instead (with a warning), as vLLM falls back."""

from __future__ import annotations

import logging
from collections import defaultdict

import msgspec
import torch.distributed as dist

from engram.config import EngramConfig, ParallelConfig
from engram.memory.host import HostLimits
from engram.runtime.dist import all_gather_json, new_group
from engram.runtime.placement.node_memory import node_of_this_process
from engram.runtime.placement.shm import shared_capacity_error

log = logging.getLogger("engram")


def replicas_per_node(nodes: list[str], tp: int, dp: int) -> int | None:
    """The replicas per node when, at every TP rank, each node holds one contiguous block of L replicas
    (the same L everywhere); None when the nodes do not line up. nodes[rank], rank = dp_rank * TP + tp_rank."""
    sizes = set()
    for tp_rank in range(tp):
        blocks: dict[str, list[int]] = defaultdict(list)
        for dp_rank in range(dp):
            blocks[nodes[dp_rank * tp + tp_rank]].append(dp_rank)
        for members in blocks.values():
            if members != list(range(members[0], members[0] + len(members))):
                return None
            sizes.add(len(members))
    if len(sizes) != 1:
        return None
    size = sizes.pop()
    return size if dp % size == 0 else None


def align_to_nodes(
    config: EngramConfig,
    parallel: ParallelConfig,
    *,
    resolved: bool = False,
    table_bytes: int = 0,
    limits: HostLimits | None = None,
) -> tuple[EngramConfig, ParallelConfig]:
    """Collective over the whole job (dp_shared_memory with DP > 1 only): the config and parallel sizes
    the plan should use on the nodes the job really has. `resolved`: dp_shared_memory was null and resolved
    to true, so, as vLLM 0.33 does, a node that cannot hold `table_bytes` of shared tables (its memory,
    `limits` when given, or ENGRAM_SHM_DIR's free space) makes every replica keep a private copy instead,
    with a warning; an explicit true is an error there when the table is created."""
    dp, tp = parallel.data_parallel_size, parallel.tensor_parallel_size
    if not (config.dp_shared_memory and dp > 1) or dist.get_world_size() != tp * dp:
        return config, parallel
    world = new_group(list(range(tp * dp)), "engram node identities")
    nodes = all_gather_json(world, node_of_this_process(), "node identities")
    local = replicas_per_node(nodes, tp, dp)
    if local is None:
        log.warning(
            "dp_shared_memory: the data-parallel replicas do not line up with the nodes (%d nodes for DP %d); every replica keeps a private copy of the tables instead",
            len(set(nodes)), dp,
        )  # fmt: skip
        return msgspec.structs.replace(config, dp_shared_memory=False), parallel
    if resolved:
        errors = all_gather_json(world, shared_capacity_error(table_bytes, limits), "shared table capacity")
        refused = next((e for e in errors if e), None)
        if refused:
            log.warning(
                "dp_shared_memory was null and resolved to true, but %s; every replica keeps a private copy of the tables instead",
                refused,
            )
            return msgspec.structs.replace(config, dp_shared_memory=False), parallel
    if local != parallel.data_parallel_size_local:
        log.info(
            "dp_shared_memory: %d replicas per node as the job runs (configured: %s)",
            local,
            parallel.data_parallel_size_local,
        )
    return config, msgspec.structs.replace(parallel, data_parallel_size_local=local)
