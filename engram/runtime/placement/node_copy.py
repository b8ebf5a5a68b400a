"""Tables shared by every engine of the node (node_sharing): each shard's copy is found by what it holds,
or loaded from the checkpoint once for the node (engram.runtime.placement.node_sharing has the protocol)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.memory.host_numa import small_pages
from engram.memory.mapping import Mapping
from engram.memory.registration import CudaRuntime, read_only_supported
from engram.runtime.checkpoints.content import rows_digests
from engram.runtime.checkpoints.loader import Checkpoint, load_shards, stored_rows
from engram.runtime.dist import timeout_s
from engram.runtime.placement.agent_requests import NOT_RUNNING, Wanted, ask_agent
from engram.runtime.placement.node_sharing import Copy, ShareKey, Stage, find, obtain, writer_refusal
from engram.runtime.placement.numa import copy_node
from engram.runtime.placement.rendezvous import rendezvous
from engram.runtime.placement.storage import shard_over
from engram.runtime.shard import ShardFormat, TableShard
from engram.user_cache import cache_subdir

log = logging.getLogger("engram")


def table_files(checkpoint: Checkpoint, name: str) -> list[Path]:
    """The checkpoint's files holding table `name`'s tensors."""
    return sorted({checkpoint.tensor_files[t] for t in checkpoint.shapes if t.startswith(f"{name}.")})


def share_key(
    checkpoint: Checkpoint,
    name: str,
    table_rows: int,
    row_start: int,
    fmt: ShardFormat,
    node: int | None,
    node_dir: str | None = None,
) -> ShareKey:
    """The key of rows [row_start, row_start + fmt.rows) of table `name` from `checkpoint`: what they hold
    (their bytes' digests, engram.runtime.checkpoints.content), the tensors' names, shapes and dtypes,
    the rows and the row format; never where the files are. Digests are kept in the rendezvous directory
    `node_dir`, else in the user's cache."""
    tensors = sorted(t for t in checkpoint.shapes if t.startswith(f"{name}."))
    source = {"tensors": [[t, list(checkpoint.shapes[t][0]), str(checkpoint.shapes[t][1])] for t in tensors]}
    content = rows_digests(checkpoint, name, fmt, row_start, table_rows, digest_store(node_dir))
    shard = {
        "row_start": row_start, "rows": fmt.rows, "dim": fmt.dim, "dtype": fmt.dtype, "numa_node": node,
        "content": content,
    }  # fmt: skip
    return ShareKey.of(source, name, table_rows, shard)


def digest_store(node_dir: str | None) -> Path | None:
    """Where rows' digests are kept: the rendezvous directory's, or the user cache's (None where the cache
    cannot be used: the rows are then hashed at every start)."""
    if node_dir is not None:
        return rendezvous(node_dir).digests()
    try:
        return cache_subdir("digests")
    except (EngramError, OSError) as exc:
        log.warning("engram: rows' digests are not kept (%s): each start hashes the table's rows again", exc)
        return None


def node_shard(
    name: str,
    fmt: ShardFormat,
    row_start: int,
    table_rows: int,
    checkpoint: Checkpoint,
    *,
    mode: str,
    device: torch.device,
    runtime: CudaRuntime | None = None,
    progress: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    stage: Stage | None = None,
    node_dir: str | None = None,
) -> TableShard:
    """The node's copy of one shard (mode "node" or "numa"), attached or loaded here, read-only, found by
    the engines that meet in the rendezvous directory `node_dir` (else in this network namespace). On a
    GPU it is registered read-only for UVA where the GPU can pin read-only memory, else gathered on host
    threads (as a file-backed table on disk is)."""
    node = copy_node(mode, device)
    copy, key = obtain_rows(
        checkpoint, name, fmt, row_start, table_rows, node=node, node_dir=node_dir, progress=progress,
        on_bytes=on_bytes, stage=stage,
    )  # fmt: skip
    if runtime is not None and not read_only_supported(runtime):
        log.warning(
            "engram: this GPU cannot register read-only host memory: the node's shared copy of %s is gathered on "
            "host threads and copied, not read over UVA (node_sharing 'off' pins a private copy)",
            name,
        )
        runtime = None
    if runtime is not None:
        small_pages("a table every engine of the node shares (node_sharing) is a registered memfd")
    shard = shard_over(
        name, fmt, "node", copy.mapping, row_start=row_start, runtime=runtime, note=copy.note, read_only=True
    )
    shard.loaded_by, shard.attached = copy.loaded_by, copy.attached
    if copy.attached:
        differ = sampled_differences(shard, checkpoint, table_rows)
        if differ[0]:
            shard.release()
            raise EngramError(
                f"the node's copy of {key.describe} differs from the checkpoint in {differ[0]} of {differ[1]} rows sampled: "
                f"the file changed since pid {copy.loaded_by} loaded it, without its times changing (written "
                "through a mapping); restart the engines that map the copy (it goes with the last of them), or "
                "set node_sharing 'off'"
            )
    return shard


def obtain_rows(
    checkpoint: Checkpoint,
    name: str,
    fmt: ShardFormat,
    row_start: int,
    table_rows: int,
    *,
    node: int | None,
    node_dir: str | None,
    progress: bool = True,
    on_bytes: Callable[[int], None] | None = None,
    stage: Stage | None = None,
    agent: bool = True,
    expected: str | None = None,
) -> tuple[Copy, ShareKey]:
    """The node's copy of rows [row_start, row_start + fmt.rows) of table `name` (NUMA node `node`) and its
    key: attached, loaded by the node agent where `node_dir` has one (`agent`: ask it), or loaded here.
    `expected`: the key's digest the caller was told (a node agent's request), refused unless it is this."""
    refusal = writer_refusal(table_files(checkpoint, name))  # asked before hashing, loading and attaching
    if refusal:
        raise EngramError(refusal)
    key = share_key(checkpoint, name, table_rows, row_start, fmt, node, node_dir)
    if expected is not None and key.digest != expected:
        raise EngramError("the files sent hold other rows than the request's key names")

    def fill(mapping: Mapping) -> None:
        loading = shard_over(name, fmt, "node", mapping, row_start=row_start)
        load_shards([loading], {name: table_rows}, checkpoint, progress=progress, on_bytes=on_bytes)

    timeout = timeout_s()
    directory = None if node_dir is None else rendezvous(node_dir)
    copy = None
    if agent and directory is not None and directory.agent_expected():
        copy = find(key, fmt.nbytes, node_dir)
        if copy is None:
            wanted = Wanted(name, fmt.rows, fmt.dim, fmt.dtype, row_start, table_rows, node, key.digest)
            why = ask_agent(directory, wanted, table_files(checkpoint, name), time.monotonic() + timeout)
            if why:  # said once per agent that is down; every other refusal is the table's own
                quiet = why == NOT_RUNNING.format(path=directory.path)
                (log.info if quiet else log.warning)("engram: %s: %s; this engine loads it", key.describe, why)
    if copy is None:
        copy = obtain(key, fmt.nbytes, fill, timeout=timeout, node=node, stage=stage, node_dir=node_dir)
    return copy, key


SAMPLED_ROWS = 64  # rows of an attached copy compared with the file: a few preads, at random places


def sampled_differences(shard: TableShard, checkpoint: Checkpoint, table_rows: int) -> tuple[int, int]:
    """(rows that differ, rows compared) of about SAMPLED_ROWS rows of a node copy (its first and last, the
    others drawn at random) against the checkpoint's bytes now, weights and block scales: a file changed by
    a writer that left its times alone (one this engine could not see) is caught with a probability that
    grows with the share of rows it changed. Rows in a file that is not safetensors are not compared."""
    if not shard.rows:
        return 0, 0
    drawn = torch.randint(shard.row_start, shard.row_stop, (SAMPLED_ROWS - 2,), generator=_fresh_generator())
    rows = sorted({shard.row_start, shard.row_stop - 1, *drawn.tolist()})
    local = torch.tensor(rows) - shard.row_start
    differ, compared = torch.zeros(len(rows), dtype=torch.bool), 0
    for part, held in (("weight", shard.weight), ("scale", shard.scale)):
        stored = None if held is None else stored_rows(checkpoint, shard, table_rows, part, rows)
        if stored is not None:
            assert isinstance(held, torch.Tensor)  # a node copy is one tensor a part
            differ |= (held.view(torch.uint8)[local] != stored).any(dim=1)
            compared = len(rows)
    return int(differ.sum()), compared


def _fresh_generator() -> torch.Generator:
    """A generator no one can predict: which rows are compared is not known to a writer in advance."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
