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

from dataclasses import dataclass
from typing import Literal

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.memory.host_numa import pinned_for_gpu, small_pages
from engram.memory.mapping import Mapping, map_anonymous, round_up
from engram.memory.registration import CudaRuntime, register
from engram.ops.formats import FORMATS, RowFormat
from engram.ops.segments import Rows
from engram.runtime.dist import Group
from engram.runtime.placement import shm
from engram.runtime.placement.hugepages import map_huge

Placement = Literal["device", "pinned", "hugepages", "node", "shm", "host", "file"]
ALIGN = 128
TABLE_SCALE_DTYPE = torch.float32


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


@dataclass(frozen=True)
class ShardFormat:
    """Shape and bytes of a shard: `rows` rows of `dim` values stored as `dtype` (engram.ops.formats)."""

    rows: int
    dim: int
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in FORMATS:
            raise EngramError(f"table dtype must be one of {', '.join(FORMATS)}, got {self.dtype!r}")
        problem = FORMATS[self.dtype].check_dim(self.dtype, self.dim)
        if problem:
            raise EngramError(problem)

    @property
    def row_format(self) -> RowFormat:
        return FORMATS[self.dtype]

    @property
    def scaled(self) -> bool:
        """Rows carry block scales."""
        return self.row_format.scale is not None

    @property
    def weight_shape(self) -> tuple[int, int]:
        return self.rows, self.row_format.weight_width(self.dim)

    @property
    def scale_shape(self) -> tuple[int, int]:
        return self.rows, self.row_format.scale_width(self.dim)

    @property
    def weight_bytes(self) -> int:
        return self.rows * self.row_format.weight_width(self.dim) * self.row_format.weight.itemsize

    @property
    def scale_offset(self) -> int:
        return round_up(self.weight_bytes, ALIGN)

    @property
    def scale_end(self) -> int:
        f = self.row_format
        scales = self.rows * f.scale_width(self.dim) * f.scale.itemsize if f.scale is not None else 0
        return self.scale_offset + scales if scales else self.weight_bytes

    @property
    def table_scale_offset(self) -> int:
        return round_up(self.scale_end, ALIGN)

    @property
    def nbytes(self) -> int:
        """Bytes the shard occupies: weights, block scales and the table scale, each 128-byte aligned."""
        if self.row_format.table_scale:
            return self.table_scale_offset + TABLE_SCALE_DTYPE.itemsize
        return self.scale_end

    @property
    def row_bytes(self) -> int:
        return self.row_format.row_bytes(self.dim)


@dataclass(eq=False)
class TableShard:
    name: str
    row_start: int
    format: ShardFormat
    placement: Placement
    weight: Rows  # a tensor; rows in pieces (Segmented) for a file-backed table its checkpoint splits
    scale: Rows | None
    mapping: Mapping | None = None  # the memory this shard owns (none for device and file-backed shards)
    device_pointer: int | None = None  # UVA pointer of a registered host shard
    note: str = ""
    # File-backed shards: the mappings of the files their weight and scale live in (often one), shared
    # with every other shard of those files, and whether any was out of the page cache when mapped.
    files: tuple[Mapping, ...] = ()
    readahead: bool = False
    table_scale: torch.Tensor | None = None  # float32 [1] in host memory: the scale of fp8-table and nvfp4 rows
    loaded_by: int | None = None  # a node copy's: the pid that loaded it (this process's when it did)
    attached: bool = False  # a node copy another process loaded

    @property
    def rows(self) -> int:
        return self.format.rows

    @property
    def sealed(self) -> bool:
        """A node copy, complete and read-only: writing to it would fault, and loaders copy nothing."""
        return self.placement == "node" and self.loaded_by is not None

    @property
    def row_stop(self) -> int:
        return self.row_start + self.format.rows

    def release(self) -> bool:
        """Free the shard now. True when its memory is gone; False when a view held elsewhere still
        keeps it (it goes with the last view). Also happens when the shard is garbage collected."""
        self.weight = self.scale = self.table_scale = torch.empty(0)
        if self.files:  # the file mappings are shared: each goes with its last view and its checkpoint
            return not any(f.mapped for f in self.files)
        return self.mapping.release() if self.mapping is not None else True


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
