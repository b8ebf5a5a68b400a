"""Tables shared by every engine of the node (node_sharing): each shard's copy is found by what it holds,
or loaded from the checkpoint once for the node (engram.runtime.placement.node_sharing has the protocol)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.memory.host_numa import small_pages
from engram.memory.mapping import Mapping
from engram.memory.registration import CudaRuntime, read_only_supported
from engram.runtime.checkpoints.loader import Checkpoint, load_shards
from engram.runtime.dist import timeout_s
from engram.runtime.placement.node_sharing import ShareKey, Stage, file_identity, obtain, writers
from engram.runtime.placement.numa import copy_node
from engram.runtime.placement.storage import shard_over
from engram.runtime.shard import ShardFormat, TableShard

log = logging.getLogger("engram")


def table_files(checkpoint: Checkpoint, name: str) -> list[Path]:
    """The checkpoint's files holding table `name`'s tensors."""
    return sorted({checkpoint.tensor_files[t] for t in checkpoint.shapes if t.startswith(f"{name}.")})


def share_key(
    checkpoint: Checkpoint, name: str, table_rows: int, row_start: int, fmt: ShardFormat, node: int | None
) -> ShareKey:
    """The key of rows [row_start, row_start + fmt.rows) of table `name` from `checkpoint`: the identity
    of the files holding its tensors, their names, shapes and dtypes, the rows and the row format."""
    tensors = sorted(t for t in checkpoint.shapes if t.startswith(f"{name}."))
    files = table_files(checkpoint, name)
    source = {
        "files": [file_identity(f) for f in files],
        "tensors": [[t, list(checkpoint.shapes[t][0]), str(checkpoint.shapes[t][1])] for t in tensors],
    }
    shard = {"row_start": row_start, "rows": fmt.rows, "dim": fmt.dim, "dtype": fmt.dtype, "numa_node": node}
    return ShareKey.of(source, name, table_rows, shard)


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
) -> TableShard:
    """The node's copy of one shard (mode "node" or "numa"), attached or loaded here, read-only. On a GPU
    it is registered read-only for UVA where the GPU can pin read-only memory, else gathered on host
    threads (as a file-backed table on disk is)."""
    node = copy_node(mode, device)
    key = share_key(checkpoint, name, table_rows, row_start, fmt, node)
    busy = writers(table_files(checkpoint, name))  # asked before loading and before attaching
    if busy:
        path, pids = next(iter(busy.items()))
        raise EngramError(
            f"{path} is mapped writable and shared by pid {', '.join(map(str, pids[:8]))}: its bytes may change "
            "without its times changing, so no node copy can be known to hold them; stop that writer, or set "
            "node_sharing 'off'"
        )

    def fill(mapping: Mapping) -> None:
        loading = shard_over(name, fmt, "node", mapping, row_start=row_start)
        load_shards([loading], {name: table_rows}, checkpoint, progress=progress, on_bytes=on_bytes)

    copy = obtain(key, fmt.nbytes, fill, timeout=timeout_s(), node=node, stage=stage)
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
    return shard
