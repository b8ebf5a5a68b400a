"""Functions the multi-process tests run in each spawned rank (importable, as spawn requires)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from engram.ngram.spec import ModelSpec
from engram.runtime import dist as edist
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.shm import shm_dir
from engram.runtime.placement.storage import allocate
from engram.runtime.rank_tables import open_tables, tables_pss
from engram.runtime.shard import Placement, ShardFormat, TableShard


def shard_digest(shard: TableShard) -> str:
    digest = hashlib.sha256(shard.weight.view(torch.uint8).numpy().tobytes())
    if shard.scale is not None:
        digest.update(shard.scale.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def load_tables(rank: int, world: int, spec: ModelSpec, checkpoint: str, placement: Placement) -> dict[str, Any]:
    """Every rank is a DP replica on one node (TP 1): allocate, load, measure, while all are alive."""
    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    shards = open_tables(spec, Checkpoint(checkpoint), placement, group=group, progress=False)
    edist.barrier(group, "loaded")
    left = sorted(p.name for p in shm_dir().iterdir() if p.name.startswith("engram-"))
    digests = {s.name: shard_digest(s) for s in shards}  # reads every page (file-backed: faults them in)
    edist.barrier(group, "read")
    table_pss = tables_pss(shards)
    edist.barrier(group, "measured")  # nobody unmaps before everyone has read its smaps
    return {
        "digests": digests,
        "pss": table_pss,
        "left_in_shm": left,
        "pid": os.getpid(),
    }


def load_then_stall(rank: int, world: int, spec: ModelSpec, checkpoint: str, signal_file: str) -> None:
    """The leader writes signal_file once it is copying, then stalls there until it is killed."""
    group = edist.new_group(list(range(world)), "engram shared tables (test)")

    def on_bytes(_: int) -> None:
        if rank == 0:
            Path(signal_file).write_text(str(os.getpid()))
            time.sleep(600)

    open_tables(spec, Checkpoint(checkpoint), "shm", group=group, progress=False, on_bytes=on_bytes)


def allocate_only(rank: int, world: int, size: int) -> str:
    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    allocate("big", ShardFormat(size, 32, "fp8"), "shm", group=group)
    return "allocated"


def allocate_as_node(rank: int, world: int) -> str:
    """Each rank claims its own node: the shared-memory group must refuse to span them."""
    os.environ["ENGRAM_NODE_ID"] = f"node-{rank}"
    return allocate_only(rank, world, 1000)


def meet(rank: int, world: int) -> int:
    """Join a group and pass a barrier: what a rank does right after the rendezvous."""
    edist.barrier(edist.new_group(list(range(world)), "engram launch (test)"), "met")
    return rank


def share_then_wait(rank: int, world: int, size: int, peer_delay: float) -> int:
    """A shared table of `size` bytes through shm.create_shared; peers arrive `peer_delay` s late, which
    holds the leader between creating the table and the fence (the instant a crash used to leak it)."""
    from engram.runtime.placement.shm import create_shared

    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    if rank:
        time.sleep(peer_delay)
    mapping = create_shared(size, group, "kill-test")
    edist.barrier(group, "shared")
    return mapping.length


def null_shared_tables(rank: int, world: int, spec: ModelSpec, checkpoint: str) -> dict[str, Any]:
    """EngramTables from the default config (dp_shared_memory null) at DP `world`: the placement it took,
    and the warnings it logged."""
    import logging

    from engram.config import ParallelConfig, load_config
    from engram.runtime.engine import EngramTables

    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("engram").addHandler(handler)
    tables = EngramTables.build(
        spec, load_config({}, env={}), ParallelConfig(data_parallel_size=world), checkpoint, progress=False
    )
    return {"placement": tables.rank_plan.placement, "warnings": warnings}


def share_and_write(rank: int, world: int, size: int, peer_delay: float) -> str:
    """share_then_wait, and the leader then writes its 'rows' (0xAB) through its mapping: where they land
    shows which file the group really shared."""
    from engram.runtime.placement.shm import create_shared

    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    if rank:
        time.sleep(peer_delay)
    mapping = create_shared(size, group, "race-test")
    if rank == 0:
        mapping.view(0, (size,), torch.uint8).fill_(0xAB)
    edist.barrier(group, "written")
    return bytes(mapping.view(0, (4,), torch.uint8).tolist()).hex()


def share_with_a_failing_peer(rank: int, world: int, size: int) -> int:
    """A memfd table whose rank 1 cannot take the leader's fd: the leader must hear of it through the
    fence, not wait out the group's timeout at its socket."""
    from engram.runtime.placement import memfd

    if rank == 1:
        memfd._receive = lambda *_: (None, "rank 1 could not take the fd (test)")  # type: ignore[assignment]
    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    return memfd.share_memfd(size, group, "failing-peer").length


def share_with_a_late_peer(rank: int, world: int, size: int, delay: float) -> int:
    """A memfd table whose peers come to the leader's socket `delay` s after it was announced: the
    window in which a stranger reaches it first."""
    from engram.runtime.placement import memfd

    receive = memfd._receive

    def late(*args: Any) -> Any:
        time.sleep(delay)
        return receive(*args)

    memfd._receive = late  # type: ignore[assignment]
    group = edist.new_group(list(range(world)), "engram shared tables (test)")
    return memfd.share_memfd(size, group, "late-peer").length


def sleep_long(rank: int, world: int) -> None:
    """Outlives any test: only its caller's death ends it early."""
    time.sleep(600)
