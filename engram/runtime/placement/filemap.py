"""File-backed tables: each shard is a view of a read-only shared mapping of the safetensors file that
holds it, in the file's own dtype and layout (fp8 rows and their ue8m0 scales are separate tensors).
Nothing is copied at start-up, every process on the node shares the page cache's pages, and tables may
exceed RAM (the kernel pages rows in and out). A checkpoint's files are mapped once, for as long as the
checkpoint lives.

Safety: every header and tensor byte range is validated against the file size before the mapping is
made (SafetensorsFile), the file's identity is kept, and rows are read only by the guarded CPU kernel
(kernels/cpu/guard_cpu.h), so a file truncated while mapped is an error naming it (file_changes), never
SIGBUS. A file replaced by rename keeps serving the old, complete pages (the mapping holds the old inode).

A file on disk is mapped with MADV_RANDOM, so a fault does not drag in neighbouring pages nobody asked
for, and its descriptor takes O_DIRECT for reads past the page cache. How its rows are then read:
file_reads (through the page cache, asked for ahead) and direct_reads (past it, a RAM tier's misses)."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import functools
import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.memory.mapping import HUGETLBFS_MAGIC, Mapping, madvise, map_readonly_file
from engram.memory.registration import ATTRIBUTE_READ_ONLY_REGISTER, CudaRuntime, read_only_supported, register
from engram.ops import cpu
from engram.ops.segments import Rows, Segmented
from engram.runtime.checkpoints.files import open_regular
from engram.runtime.checkpoints.loader import (
    Checkpoint,
    SafetensorsFile,
    expected_parts,
    table_pieces,
    table_scale_tensor,
)
from engram.runtime.placement.file_changes import file_stamp
from engram.runtime.shard import TABLE_SCALE_DTYPE, ShardFormat, TableShard

log = logging.getLogger("engram")
TMPFS_MAGIC = 0x01021994
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
MADV_RANDOM = 1


@dataclass(eq=False)
class MappedFile:
    file: SafetensorsFile
    mapping: Mapping
    in_memory_fs: bool  # tmpfs or hugetlbfs: pages never leave RAM, so the GPU may read them over UVA
    readahead: bool  # on disk: fault-around is off, and lookups probe for cold pages and ask for them first
    uva: bool = False  # registered read-only: the GPU reads its pages directly


# Each checkpoint's mappings of its files, by path: one per file, for every table of it, until it goes.
_mappings: weakref.WeakKeyDictionary[Checkpoint, dict[Path, MappedFile]] = weakref.WeakKeyDictionary()


def in_files(shard: TableShard, part: Rows) -> bool:
    """Whether `part` of a shard is a view of one of its files (not a private copy: private_scales)."""
    return mapping_of(shard, part.data_ptr()) is not None


def mapping_of(shard: TableShard, address: int) -> Mapping | None:
    """The mapping of one of `shard`'s files that `address` lies in, or None (memory of its own)."""
    return next((m for m in shard.files if m.addr <= address < m.addr + m.length), None)


def in_memory_fs(path: str) -> bool:
    """Whether `path` lies on tmpfs or hugetlbfs, whose pages stay in memory (and may be pinned for UVA)."""
    buf = (ctypes.c_long * 32)()  # struct statfs; f_type is its first field on Linux
    if _libc.statfs(path.encode(), buf) != 0:
        return False
    return (buf[0] & 0xFFFFFFFF) in (TMPFS_MAGIC, HUGETLBFS_MAGIC)


def map_file(file: SafetensorsFile) -> MappedFile:
    """One read-only mapping of a validated file, after checking it is still the file that was validated.
    The mapping keeps the file's descriptor (closed with it): a later question about the file (did it
    shrink, was it rewritten) is asked of the inode mapped, never of whatever the name holds by then. On
    disk, O_DIRECT is set on it for reads past the page cache (keep_direct)."""
    fd = open_regular(file.path, "checkpoint file")
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != file.identity:
            raise EngramError(f"{file.path}: the file changed between validation and mapping; start again")
        mapping = map_readonly_file(fd, info.st_size, str(file.path))
    except BaseException:
        os.close(fd)
        raise
    mapping.fd = fd
    mapping.on_release(functools.partial(os.close, fd))
    in_memory = in_memory_fs(str(file.path))
    if not in_memory:  # random rows: the kernel's read-around would fetch pages nobody asked for
        madvise(mapping.addr, mapping.length, MADV_RANDOM)
        keep_direct(mapping, fd)
    return MappedFile(file, mapping, in_memory, not in_memory)


def keep_direct(mapping: Mapping, fd: int) -> bool:
    """Set O_DIRECT on `fd` (the mapped file's own descriptor, never opened again by name) for reads past
    the page cache. False where the file system refuses O_DIRECT or ENGRAM_DIRECT_READS=0 says not to. O_NONBLOCK goes: io_uring
    would hand back EAGAIN for a full device queue instead of waiting."""
    if os.environ.get("ENGRAM_DIRECT_READS", "1") == "0":
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, (flags & ~os.O_NONBLOCK) | os.O_DIRECT)
    except OSError:
        return False  # said when a tier would read past the page cache (direct_reads_work)
    mapping.direct_fd = fd
    return True


def uva_readable(mapped: MappedFile, runtime: CudaRuntime) -> bool:
    """Register a file on an in-memory file system read-only, so the GPU reads its pages over UVA; where
    the GPU cannot pin read-only memory, say so once and leave the file to the host-thread gather."""
    if not read_only_supported(runtime):
        log.warning(
            "engram: this GPU cannot register read-only host memory (device attribute %d is 0): file-backed "
            "tables in %s are gathered on host threads and copied, not read over UVA",
            ATTRIBUTE_READ_ONLY_REGISTER,
            mapped.file.path,
        )
        return False
    register(mapped.mapping, runtime, read_only=True)
    return True


def _safetensors_file(checkpoint: Checkpoint, tensor: str) -> SafetensorsFile:
    file = checkpoint.files.get(tensor)
    if file is None:
        where = "is missing" if tensor not in checkpoint.shapes else "is not in a safetensors file"
        raise EngramError(f"file_backed tables are served from safetensors checkpoints; {tensor} {where}")
    return file


def _mapped(checkpoint: Checkpoint, file: SafetensorsFile, runtime: CudaRuntime | None) -> MappedFile:
    """The checkpoint's one read-only mapping of `file`, made on first use (registered for UVA where it can
    be), kept while the checkpoint lives."""
    mine = _mappings.setdefault(checkpoint, {})
    mapped = mine.get(file.path)
    if mapped is None:
        mapped = mine[file.path] = map_file(file)
        if runtime is not None and mapped.in_memory_fs:
            mapped.uva = uva_readable(mapped, runtime)
    return mapped


def file_shard(
    name: str, fmt: ShardFormat, row_start: int, table_rows: int, checkpoint: Checkpoint, runtime: CudaRuntime | None
) -> TableShard:
    """Rows [row_start, row_start + fmt.rows) of table `name`, viewed in place in the checkpoint's file: one
    tensor of the table's, or where the checkpoint splits it into `shard_<k>` parts (table_pieces), the
    pieces of the parts the rows span, read as one (engram.ops.segments). With a CUDA runtime, a table in one
    tensor of a file on tmpfs or hugetlbfs is registered (read-only) for UVA, so the GPU gathers from the
    page cache's own pages; any other file, and every split table, is gathered on host threads
    (EngramEmbedding)."""
    if cpu.cpu_library() is None:
        raise EngramError(
            f"file_backed tables are read only by the guarded native CPU kernels, unavailable here: {cpu.unavailable_reason()}"
        )
    if row_start < 0 or row_start + fmt.rows > table_rows:  # the view would run into the file's next tensor
        raise EngramError(
            f"{name}: rows [{row_start:,}, {row_start + fmt.rows:,}) are not all in its {table_rows:,} rows; a file-backed shard must lie within its table"
        )
    views: dict[str, Rows] = {}
    files: list[MappedFile] = []
    problems: list[str] = []
    parts = {part: table_pieces(checkpoint.shapes, name, suffix, table_rows, width, dtype) for part, (suffix, width, dtype) in expected_parts(fmt).items()}  # fmt: skip
    scale_name, problem = table_scale_tensor(checkpoint, name, fmt)
    problems += [wrong for _, found in parts.values() for wrong in found] + ([problem] if problem else [])
    if problems:
        raise EngramError("checkpoint does not match the model: " + "; ".join(problems))
    for part, (pieces, _) in parts.items():
        width, dtype = expected_parts(fmt)[part][1:]
        mine: list[tuple[int, torch.Tensor]] = []  # (shard-local start, view) of each piece the rows span
        for piece in pieces:
            lo, hi = max(piece.start, row_start), min(piece.start + piece.rows, row_start + fmt.rows)
            if hi <= lo:
                continue
            file = _safetensors_file(checkpoint, piece.tensor)
            mapped = _mapped(checkpoint, file, runtime if len(pieces) == 1 else None)
            offset = file.data_start + file.entries[piece.tensor].begin + (lo - piece.start) * width * dtype.itemsize
            mine.append((lo - row_start, mapped.mapping.view(offset, (hi - lo, width), dtype)))
            files += [mapped] if mapped not in files else []
        if len(mine) == 1:
            views[part] = mine[0][1]
        elif mine:
            views[part] = Segmented(tuple(v for _, v in mine), tuple(s for s, _ in mine))
        else:  # a shard of no rows
            views[part] = torch.empty((0, width), dtype=dtype)
    table_scale = None
    if scale_name is not None:  # one float32, read in place like the rows
        file = _safetensors_file(checkpoint, scale_name)
        mapped = _mapped(checkpoint, file, runtime)
        table_scale = mapped.mapping.view(file.data_start + file.entries[scale_name].begin, (1,), TABLE_SCALE_DTYPE)
        files += [mapped] if mapped not in files else []
    split = any(len(pieces) > 1 for pieces, _ in parts.values())
    in_memory = all(f.in_memory_fs for f in files)
    uva = bool(files) and all(f.uva for f in files) and not split
    readahead = any(f.readahead for f in files)
    shown = [str(f.file.path) for f in files]
    note = "mapped from " + ", ".join(shown[:3]) + (f" and {len(shown) - 3} more files" if len(shown) > 3 else "")
    note += f" ({len(parts['weight'][0])} parts)" if split else ""
    note += (" (in-memory file system)" if in_memory else "") + (" (read ahead per lookup)" if readahead else "")
    pointer = views["weight"].data_ptr() if uva else None
    return TableShard(
        name, row_start, fmt, "file", views["weight"], views.get("scale"), None, pointer, note,
        files=tuple(f.mapping for f in files), file_stamps=[file_stamp(f.mapping) for f in files],
        readahead=readahead, table_scale=table_scale,
    )  # fmt: skip
