"""What a table shard is, whatever holds it: rows [row_start, row_start + rows) of one table in one row
format (engram.ops.formats), laid out as weights, block scales and the table scale (each 128-byte
aligned), and what a lookup may return. The runtime's ground floor: checkpoints/ (which reads and writes
these layouts), placement/ (which gives them memory), the tiers and the readers all stand on it.

Where each placement keeps its memory is placement/storage.py's table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from engram.errors import EngramError
from engram.memory.mapping import Mapping, round_up
from engram.ops.formats import FORMATS, RowFormat
from engram.ops.segments import Rows

Placement = Literal["device", "pinned", "hugepages", "node", "shm", "host", "file"]
ALIGN = 128
TABLE_SCALE_DTYPE = torch.float32

# The output kind of the stored bytes: each row's weight bytes, then its block scales' bytes (uint8).
PACKED: Literal["packed"] = "packed"
Output = torch.dtype | Literal["packed"]
Part = Literal["weight", "scale", "table_scale"]  # what a shard stores: rows, block scales, the table scale


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
    # Per file, its (size, mtime_ns, ctime_ns) when this shard last took its pages as the table's: each
    # shard of a file notices a rewrite on its own (engram.runtime.placement.file_changes.rewritten).
    file_stamps: list[tuple[int, int, int]] = field(default_factory=list)
    file_scale: Rows | None = None  # the file's block scales, where `scale` is a private copy (a RAM tier's)
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
    def staged(self) -> bool:
        """A file (or a node copy) the GPU cannot read over UVA (not on tmpfs or hugetlbfs, not registered):
        host threads gather its rows for a GPU's lookups, one copy."""
        return self.placement in ("file", "node") and self.device_pointer is None

    @property
    def row_stop(self) -> int:
        return self.row_start + self.format.rows

    def release(self) -> bool:
        """Free the shard now. True when its memory is gone; False when a view held elsewhere still
        keeps it (it goes with the last view). Also happens when the shard is garbage collected."""
        self.weight = self.scale = self.table_scale = torch.empty(0)
        self.file_scale = None
        if self.files:  # the file mappings are shared: each goes with its last view and its checkpoint
            return not any(f.mapped for f in self.files)
        return self.mapping.release() if self.mapping is not None else True
