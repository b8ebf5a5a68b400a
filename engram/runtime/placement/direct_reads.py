"""Reads of a file-backed shard's rows past the page cache: a RAM tier reads its misses with O_DIRECT
through io_uring (engram_read_direct_cpu) straight into its slots, on the mapped file's own descriptor
(filemap.keep_direct), so that the page cache gains no page. Where io_uring or O_DIRECT is refused, or
reads wrong, the tier reads through the page cache (file_reads) instead, said once per file."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import tempfile
from dataclasses import dataclass

import torch

from engram.errors import EngramError
from engram.memory.mapping import PAGE
from engram.ops import cpu
from engram.ops.segments import Rows, pieces_of
from engram.runtime.placement.file_changes import check_files, files_named_on_fault
from engram.runtime.placement.file_reads import READAHEAD_TIMEOUT_S, Asked, stored_part_rows
from engram.runtime.placement.filemap import in_files, mapping_of
from engram.runtime.shard import TableShard

log = logging.getLogger("engram")


DIRECT_DEPTH = 128  # reads in flight at once: the depth of the disk's request queue (nr_requests) here
DIRECT_MAX_RANGE = 64 << 10  # the most one read brings: DIRECT_DEPTH x this of buffers (8 MiB) a call
DIRECT_GAP = 0  # pages between rows are not read: a direct read keeps only the rows, so a gap is waste
_direct_warned: set[str] = set()


class DirectReadsFailed(EngramError):
    """A read past the page cache that io_uring could not make (errno `code`: EMFILE when the process
    is out of descriptors, EPERM under a sandbox applied after start, ...), where the disk was not at
    fault: the same rows can still be read through the page cache."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DirectPieces:
    """Where a part of a file-backed shard lies on disk, as engram_read_direct_cpu takes it: each piece's
    file (its O_DIRECT descriptor and size), the piece's file offset, and the shard-local row it starts at."""

    fds: list[int]
    sizes: list[int]
    offsets: list[int]
    starts: list[int]
    paths: list[str]


def direct_pieces(shard: TableShard, part: Rows) -> DirectPieces | None:
    """Where `part` of a shard lies in its files, when every one of them is read past the page cache
    (keep_direct); None for a part in memory, or one in a file read through the page cache."""
    found = DirectPieces([], [], [], [], [])
    for start, piece in pieces_of(part):
        mapping = mapping_of(shard, piece.data_ptr())
        if mapping is None or mapping.direct_fd is None:
            return None
        found.fds.append(mapping.direct_fd)
        found.sizes.append(mapping.size)
        found.offsets.append(piece.data_ptr() - mapping.addr)
        found.starts.append(start)
        found.paths.append(str(mapping.path))
    return found


def direct_file(shard: TableShard, part: Rows) -> bool:
    """Whether every file `part` of a shard lies in is read past the page cache."""
    return direct_pieces(shard, part) is not None


def read_direct(shard: TableShard, part: Rows, rows: torch.Tensor, slots: torch.Tensor, into: torch.Tensor) -> Asked:
    """Rows `rows` (global ids of the shard's, ascending, distinct) of `part` read from the disk into
    `into[slots]` past the page cache (engram_read_direct_cpu), so the page cache gains no page; what was
    read. A read that fails is an error naming the file, and one that comes back short names it as shrunk
    (check_files)."""
    pieces = direct_pieces(shard, part)
    library = cpu.cpu_library()
    assert pieces is not None and library is not None
    if into.dtype != part.dtype or into.shape[1:] != part.shape[1:] or not into.is_contiguous():
        raise EngramError(
            f"internal: {shard.name}'s rows are read into {into.dtype} {list(into.shape)} rows, not {part.dtype} {list(part.shape)}"
        )
    local = (rows.to(torch.int64) - shard.row_start).contiguous()
    where = slots.to(torch.int64).contiguous()
    ranges, nbytes, error = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
    status = library.engram_read_direct_cpu(
        (ctypes.c_int * len(pieces.fds))(*pieces.fds), cpu.int64s(pieces.sizes), cpu.int64s(pieces.offsets),
        cpu.int64s(pieces.starts), len(pieces.fds), part.shape[0], part.shape[1] * part.element_size(),
        cpu.ptr(local), cpu.ptr(where), local.numel(), into.data_ptr(), into.shape[0], DIRECT_GAP, DIRECT_MAX_RANGE,
        DIRECT_DEPTH, READAHEAD_TIMEOUT_S * 1000, ctypes.byref(ranges), ctypes.byref(nbytes), ctypes.byref(error),
    )  # fmt: skip
    if status == cpu.STATUS_IO:
        check_files(shard)  # a file that shrank is named as such
        why = "a read came back short" if error.value == 0 else os.strerror(error.value)
        names = ", ".join(sorted(set(pieces.paths)))
        if error.value not in (0, errno.ETIMEDOUT):  # io_uring refused, not the disk: the page cache can
            raise DirectReadsFailed(
                f"{names}: io_uring could not read {shard.name}'s rows past the page cache "
                f"({errno.errorcode.get(error.value, error.value)}: {why})",
                error.value,
            )
        raise EngramError(
            f"{names}: reading {shard.name}'s rows from the disk failed ({why}); check the device (dmesg), "
            "or set ENGRAM_DIRECT_READS=0 to read them through the page cache"
        )
    cpu.check(status, "engram_read_direct_cpu")
    return Asked(ranges.value, nbytes.value)


def direct_reads_work(shard: TableShard) -> bool:
    """Whether each part of `shard` in a file on disk is read past the page cache, checked by reading its
    first row that way and comparing it with the file's mapped page. Where that fails (a kernel without
    io_uring, or one a sandbox forbids; a file system that takes O_DIRECT but reads it wrong), say so once
    per file, and lookups read through the page cache."""
    parts = [part for part in (shard.weight, shard.scale) if part is not None and in_files(shard, part)]
    if not parts or not shard.rows:
        return False
    refused = {
        str(m.path)
        for part in parts
        for _, piece in pieces_of(part)
        if (m := mapping_of(shard, piece.data_ptr())) and m.direct_fd is None
    }
    if refused:
        if os.environ.get("ENGRAM_DIRECT_READS", "1") != "0":
            for path in sorted(refused):
                _page_cache_reads(path, "its file system refuses O_DIRECT")
        return False
    row = torch.tensor([shard.row_start])
    for part in parts:
        got = torch.empty((1, *part.shape[1:]), dtype=part.dtype)
        try:
            read_direct(shard, part, row, torch.zeros(1, dtype=torch.int64), got)
            with files_named_on_fault(shard):
                same = torch.equal(got.view(torch.uint8), stored_part_rows(shard, part, row).view(torch.uint8))
        except EngramError as exc:
            same, why = False, str(exc)
        else:
            why = "the bytes read differ from the file's"
        if not same:
            pieces = direct_pieces(shard, part)
            assert pieces is not None
            _page_cache_reads(pieces.paths[0], why)
            return False
    return True


def _page_cache_reads(path: str, why: str) -> None:
    """Say once per file that a RAM tier's misses of it are read through the page cache, and why."""
    if path not in _direct_warned:
        _direct_warned.add(path)
        log.warning("engram: %s is read through the page cache, not past it: %s", path, why)


def direct_reads_problem() -> str | None:
    """Why this process cannot read a file past the page cache (the CPU kernels missing, io_uring absent,
    forbidden by a sandbox or unable to bound a wait), or None where it can: one page of a scratch file
    read through engram_read_direct_cpu. Whether a checkpoint's own file system takes O_DIRECT is checked
    per file when a tier starts (direct_reads_work)."""
    library = cpu.cpu_library()
    if library is None:
        return f"the CPU kernels are not built: {cpu.unavailable_reason()}"
    row, into, error = torch.zeros(1, dtype=torch.int64), torch.empty(1, PAGE, dtype=torch.uint8), ctypes.c_int64()
    with tempfile.TemporaryFile() as scratch:
        scratch.write(bytes(PAGE))
        scratch.flush()
        status = library.engram_read_direct_cpu(
            (ctypes.c_int * 1)(scratch.fileno()), cpu.int64s([PAGE]), cpu.int64s([0]), cpu.int64s([0]), 1, 1, PAGE,
            cpu.ptr(row), cpu.ptr(row), 1, into.data_ptr(), 1, 0, DIRECT_MAX_RANGE, 1, 10_000, None, None,
            ctypes.byref(error),
        )  # fmt: skip
    if status == cpu.STATUS_IO:
        return f"io_uring cannot read here: {os.strerror(error.value)}"
    return None if status == 0 else f"engram_read_direct_cpu failed: {cpu.STATUS.get(status, status)}"
