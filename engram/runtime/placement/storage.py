"""Storage for one table shard: rows [row_start, row_start + rows) of one table, where the config says.

| placement | when                              | memory                                                  |
|-----------|-----------------------------------|---------------------------------------------------------|
| device    | cpu_offload=false                 | a plain tensor on the GPU (on the CPU platform: in RAM) |
| pinned    | cpu_offload=true on a GPU         | exact-size anonymous mapping, cudaHostRegister'ed, UVA  |
| hugepages | use_thp=true                  | PMD-aligned mapping on transparent huge pages           |
| node      | node_sharing="node" or "numa"     | one sealed memfd per shard for every engine of the node, read-only (sharing) |
| shm       | dp_shared_memory=true             | one memfd per shard (or a file in ENGRAM_SHM_DIR), mapped by every replica |
| host      | cpu_offload=true on the CPU       | exact-size anonymous mapping (the CPU reference)        |
| file      | file_backed=true                  | the checkpoint's own pages, mapped read-only (filemap)  |

Weights, block scales and the table scale (engram.ops.formats) share one mapping, each 128-byte aligned."""

from __future__ import annotations

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.memory.host_numa import pinned_for_gpu, small_pages
from engram.memory.mapping import Mapping, map_anonymous
from engram.memory.registration import CudaRuntime, register
from engram.runtime.dist import Group
from engram.runtime.placement import shm
from engram.runtime.placement.hugepages import map_huge
from engram.runtime.shard import TABLE_SCALE_DTYPE, Placement, ShardFormat, TableShard


def placement_for(config: EngramConfig, platform: str, *, shareable: bool = True) -> Placement:
    """Where a rank's tables live (the table above). `shareable`: whether the node's replicas have a group
    to share one copy in; without one, dp_shared_memory leaves each its own copy."""
    if not config.cpu_offload:
        return "device"
    if config.file_backed:
        return "file"
    if config.node_sharing != "off":  # every engine of the node, its own DP replicas too
        return "node"
    if config.dp_shared_memory and shareable:
        return "shm"
    if config.use_thp:
        return "hugepages"
    return "pinned" if platform in ("cuda", "rocm") else "host"


def allocate(
    name: str,
    fmt: ShardFormat,
    placement: Placement,
    *,
    row_start: int = 0,
    group: Group | None = None,
    runtime: CudaRuntime | None = None,
    device: torch.device | str | None = None,
) -> TableShard:
    """Memory for one shard. `group` is the node-local DP group (placement shm, collective); `runtime` pins
    host memory for the GPU (placement pinned, and any host placement on a GPU platform)."""
    f = fmt.row_format
    if placement == "device":
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        weight = torch.zeros(fmt.weight_shape, dtype=f.weight, device=target)
        scale = torch.zeros(fmt.scale_shape, dtype=f.scale, device=target) if f.scale is not None else None
        table_scale = torch.zeros(1, dtype=TABLE_SCALE_DTYPE) if f.table_scale else None  # read by the host
        return TableShard(
            name, row_start, fmt, placement, weight, scale, note=f"device tensor on {target}", table_scale=table_scale
        )
    note = ""
    if placement == "shm":
        if group is None:
            raise EngramError("placement shm needs the node-local DP group")
        mapping = shm.create_shared(fmt.nbytes, group, tag=name.replace(".", "-"))
    elif placement == "hugepages":
        report = map_huge(fmt.nbytes)
        mapping, note = report.mapping, report.note
    elif placement == "pinned" and runtime is not None:  # 2 MiB GPU pages where the driver gives them
        mapping = pinned_for_gpu(fmt.nbytes, runtime)
        note = "host-NUMA cuMem (2 MiB GPU pages)" if mapping.gpu_page else "registered host memory"
        return shard_over(name, fmt, placement, mapping, row_start=row_start, note=note, pointer=mapping.addr)
    elif placement in ("pinned", "host"):
        mapping = map_anonymous(fmt.nbytes, kind=placement)
    else:
        raise EngramError(f"unknown placement {placement!r}")
    if placement == "shm" and runtime is not None:
        small_pages("a table the node's replicas share (dp_shared_memory) is a registered memfd")
    return shard_over(name, fmt, placement, mapping, row_start=row_start, runtime=runtime, note=note)


def shard_over(
    name: str,
    fmt: ShardFormat,
    placement: Placement,
    mapping: Mapping,
    *,
    row_start: int = 0,
    runtime: CudaRuntime | None = None,
    note: str = "",
    read_only: bool = False,
    pointer: int | None = None,
) -> TableShard:
    """A shard whose weights, block scales and table scale are views of `mapping` (the layout of
    ShardFormat), registered for UVA when `runtime` is given (`read_only`: a mapping the GPU may only read),
    or read by the GPU at `pointer` already (memory its allocator mapped for it)."""
    f = fmt.row_format
    if runtime is not None:
        pointer = register(mapping, runtime, read_only=read_only)
    weight = mapping.view(0, fmt.weight_shape, f.weight)
    scale = mapping.view(fmt.scale_offset, fmt.scale_shape, f.scale) if f.scale is not None else None
    table_scale = mapping.view(fmt.table_scale_offset, (1,), TABLE_SCALE_DTYPE) if f.table_scale else None
    return TableShard(name, row_start, fmt, placement, weight, scale, mapping, pointer, note, table_scale=table_scale)
