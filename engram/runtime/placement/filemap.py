"""File-backed tables: each shard is a view of a read-only shared mapping of the safetensors file that
holds it, in the file's own dtype and layout (fp8 rows and their ue8m0 scales are separate tensors).
Nothing is copied at start-up, every process on the node shares the page cache's pages, and tables may
exceed RAM (the kernel pages rows in and out).

Safety: every header and tensor byte range is validated against the file size before the mapping is
made (SafetensorsFile), the file's identity is kept, and rows are read only by the guarded CPU kernel
(kernels/cpu/guard_cpu.h), so a file truncated while mapped is an error naming it, never SIGBUS. A file
replaced by rename keeps serving the old, complete pages (the mapping holds the old inode).

A file on disk is read with MADV_RANDOM, so a fault does not drag in neighbouring pages nobody asked for.
Its pages may leave the page cache at any time (more tables than RAM, memory pressure, a restart), so
every lookup first probes a sample of its rows' pages (mincore, RESIDENCY_PROBES of them) and, when any is
out, asks for all its rows' pages at once (MADV_WILLNEED), sorted, deduplicated and coalesced into ranges:
the reads are then in flight together, at the device's random-read rate, rather than one fault at a time
(bench_cold_rows.py: a cold decode step 16-20x faster than faulting; preads from a thread pool or
io_uring reads into the page cache were no faster for a lookup of the table itself).

A RAM tier over the table reads its misses differently (read_direct): past the page cache, O_DIRECT
through io_uring straight into its slots, on the mapped file's own descriptor, so that the page cache
gains no page; where io_uring or O_DIRECT is refused, through the page cache as above."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import logging
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import torch

from engram.errors import EngramError
from engram.memory.mapping import HUGETLBFS_MAGIC, PAGE, Mapping, madvise, map_readonly_file
from engram.memory.registration import ATTRIBUTE_READ_ONLY_REGISTER, CudaRuntime, read_only_supported, register
from engram.ops import GatherCall, cpu
from engram.ops.segments import Rows, Segmented, pieces_of, row_addresses
from engram.runtime.checkpoints.files import open_for_writing, open_regular
from engram.runtime.checkpoints.loader import (
    Checkpoint,
    SafetensorsFile,
    expected_parts,
    table_pieces,
    table_scale_tensor,
)
from engram.runtime.placement.residency import RESIDENCY_PROBES, ResidentBudget, page_resident
from engram.runtime.shard import TABLE_SCALE_DTYPE, ShardFormat, TableShard

log = logging.getLogger("engram")
TMPFS_MAGIC = 0x01021994


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


MADV_RANDOM = 1
MADV_WILLNEED = 3
READAHEAD_GAP = PAGE  # rows at most this far apart are read as one range: one more page costs less than a read
READAHEAD_MAX_RANGE = 1 << 20  # ranges stay small enough that many are in flight at once


@dataclass(eq=False)
class MappedFile:
    file: SafetensorsFile
    mapping: Mapping
    in_memory_fs: bool  # tmpfs or hugetlbfs: pages never leave RAM, so the GPU may read them over UVA
    readahead: bool  # on disk: fault-around is off, and lookups probe for cold pages and ask for them first
    uva: bool = False  # registered read-only: the GPU reads its pages directly


def all_resident(part: Rows, row_start: int, flat: torch.Tensor, probes: int = RESIDENCY_PROBES) -> bool:
    """Whether an evenly spaced sample of these rows' pages of `part` is in the page cache (mincore)."""
    step = max(1, flat.numel() // probes)
    local = flat[::step][:probes] - row_start
    local = local[(local >= 0) & (local < part.shape[0])]
    return all(page_resident(address // PAGE * PAGE) for address in row_addresses(part, local).tolist())


class Asked(NamedTuple):
    """What a lookup's read-ahead asked for: ranges, and the bytes they span (the most it can add)."""

    ranges: int
    bytes: int


def read_ahead(shard: TableShard, ids: torch.Tensor) -> Asked | None:
    """When a sample of these rows' pages is not all resident, start reading the pages of every one of
    them (weights and scales) at once, sorted and coalesced (READAHEAD_GAP, READAHEAD_MAX_RANGE), and
    say what was asked for; None when every probed page was resident and nothing was asked."""
    flat = cold_rows(shard, ids)
    return None if flat is None else ask_for(shard, flat)


def cold_rows(shard: TableShard, ids: torch.Tensor) -> torch.Tensor | None:
    """These rows, flat int64, when a sample of their pages is not all resident and the CPU kernels that
    ask for pages are built; else None."""
    flat = ids.reshape(-1).to(torch.int64).cpu().contiguous()
    if cpu.cpu_library() is None or not flat.numel() or all_resident(shard.weight, shard.row_start, flat):
        return None
    return flat


def ask_for(shard: TableShard, flat: torch.Tensor) -> Asked:
    """Start reading the pages of the rows `flat` (cold_rows') of `shard`, weights and scales; what was asked."""
    library = cpu.cpu_library()
    assert library is not None
    scratch, ranges, nbytes, asked = torch.empty_like(flat), ctypes.c_int64(), ctypes.c_int64(), Asked(0, 0)
    for part in (shard.weight, shard.scale):
        if part is not None and in_files(shard, part):
            row_bytes = part.shape[1] * part.element_size()
            pieces = pieces_of(part)
            status = library.engram_readahead_cpu(
                cpu.addresses([p.data_ptr() for _, p in pieces]), cpu.int64s([s for s, _ in pieces]), len(pieces),
                part.shape[0], row_bytes, shard.row_start, cpu.ptr(flat), flat.numel(), READAHEAD_GAP,
                READAHEAD_MAX_RANGE, cpu.ptr(scratch), scratch.numel(), ctypes.byref(ranges), ctypes.byref(nbytes),
            )  # fmt: skip
            cpu.check(status, "engram_readahead_cpu")
            asked = Asked(asked.ranges + ranges.value, asked.bytes + nbytes.value)
    return asked


def in_files(shard: TableShard, part: Rows) -> bool:
    """Whether `part` of a shard is a view of one of its files (not a private copy: private_scales)."""
    return any(m.addr <= part.data_ptr() < m.addr + m.length for m in shard.files)


SCALE_CHUNK_ROWS = 1 << 20  # scale rows copied at a time: 8 MB of ids and scales in flight


def private_scales(shard: TableShard) -> int:
    """Read a file-backed shard's block scales into private memory, once, and serve them from there: a miss
    of its RAM tier then reads one page, its row's, where it read a page of scales too (512 rows share
    one). They are 1/33 of an fp8 table. The file's own stay as `file_scale`, to read them again
    (scales_from). The bytes they take (0 without block scales)."""
    part = shard.scale
    if part is None:
        return 0
    if in_files(shard, part):
        shard.file_scale = part
        scales_from(shard, private=True)
    return part.numel() * part.element_size()


def _copy_scales(shard: TableShard) -> None:
    """The file's block scales (file_scale) copied into the private copy (scale), a chunk at a time."""
    part, copy = shard.file_scale, shard.scale
    assert part is not None and isinstance(copy, torch.Tensor)
    for _, piece in pieces_of(part.view(torch.uint8)):  # one sequential read a piece
        madvise(piece.data_ptr() // PAGE * PAGE, piece.data_ptr() % PAGE + piece.numel(), MADV_WILLNEED)
    with files_named_on_fault(shard):
        for start in range(shard.row_start, shard.row_stop, SCALE_CHUNK_ROWS):
            rows = torch.arange(start, min(shard.row_stop, start + SCALE_CHUNK_ROWS))
            at = start - shard.row_start
            copy.view(torch.uint8)[at : at + rows.numel()] = stored_part_rows(shard, part, rows)


def scales_from(shard: TableShard, *, private: bool) -> None:
    """Where a shard that keeps its block scales privately (private_scales) serves them from from now: the
    private copy, read again from the file (after a rewrite), or the file itself (while another process
    writes it: no copy can be known to hold its bytes). Nothing for a shard that keeps none."""
    if shard.file_scale is None:
        return
    if not private:
        shard.scale = shard.file_scale
        return
    if shard.scale is shard.file_scale:  # served from the file until now: a private copy again
        shard.scale = torch.empty(shard.file_scale.view(torch.uint8).shape, dtype=torch.uint8).view(
            shard.file_scale.dtype
        )
    _copy_scales(shard)


def check_files(shard: TableShard) -> None:
    """Raise, naming the file, when a file behind a file-backed shard shrank since it was mapped (a read
    past its new end faulted; the guarded kernel turned that into an error). Asked of the inode mapped:
    a file renamed over it or unlinked leaves the mapped one as it was."""
    for mapping in shard.files:
        size = _stat(mapping).st_size
        if size < mapping.size:
            raise EngramError(
                f"{mapping.path}: truncated at offset {size:,}: the checkpoint shrank from {mapping.size:,} bytes while its tables "
                "were mapped; restore the file and restart the engine"
            )


def file_stamp(mapping: Mapping) -> tuple[int, int, int]:
    """The mapped file's (size, mtime_ns, ctime_ns) now: any rewrite in place changes one of them."""
    info = _stat(mapping)
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def rewritten(shard: TableShard) -> list[str]:
    """The files behind a file-backed shard rewritten in place since this shard last took their pages as
    the table's (file_stamps: size, mtime or ctime of the mapped inode changed: `cp new old`), each now
    taken as it is. Rows copied out of them before (a tier's) are stale. Every shard of a file keeps its
    own stamps, so each notices every rewrite."""
    changed = []
    for at, mapping in enumerate(shard.files):
        stamp = file_stamp(mapping)
        if stamp != shard.file_stamps[at]:
            shard.file_stamps[at] = stamp
            changed.append(mapping.path or "a checkpoint file")
    return changed


def being_written(shard: TableShard) -> list[str] | None:
    """The files behind a file-backed shard that a process (in any namespace) has open for writing or
    mapped writable now (open_for_writing): its writes through a mapping reach the rows without changing
    the file's times. None where that cannot be asked of a file."""
    found: list[str] = []
    for mapping in shard.files:
        writing = open_for_writing(mapping.fd if mapping.fd is not None else -1)
        if writing is None:
            return None
        if writing:
            found.append(mapping.path or "a checkpoint file")
    return found


def _stat(mapping: Mapping) -> os.stat_result:
    try:
        return os.fstat(mapping.fd if mapping.fd is not None else -1)
    except OSError as exc:
        raise EngramError(
            f"{mapping.path}: the file-backed checkpoint cannot be read any more: {exc.strerror}"
        ) from None


@contextlib.contextmanager
def files_named_on_fault(shard: TableShard) -> Iterator[None]:
    """Reads of `shard` inside: a read that faulted because a file behind a file-backed shard shrank is
    raised as the error naming that file (check_files); any other error passes unchanged."""
    try:
        yield
    except EngramError:
        if shard.files:
            check_files(shard)
        raise


def watch_files(budget: ResidentBudget, shard: TableShard) -> None:
    """Put the files behind `shard` under `budget` (file_cache_bytes); a coalesced read of one of its rows
    may bring in the gap beside it too. A shard in memory has no files, and adds nothing."""
    if shard.files:
        budget.watch(shard.files, shard.format.row_bytes + READAHEAD_GAP)


@contextlib.contextmanager
def reading(
    shard: TableShard, ids: torch.Tensor, budget: ResidentBudget | None = None, *, behind: bool = False
) -> Iterator[None]:
    """Host reads of a file-backed `shard`'s rows for `ids` inside: a cold file's pages asked for first
    (read_ahead), a read that faulted because the file shrank raised as the error naming it, and after
    the reads `budget` told what they may have added to the page cache. `behind`: the pages are asked for
    on a worker thread while the body runs, for a body with work of its own or reads in address order.
    The disk's queue is bounded, so asking for a step's pages lasts about as long as reading them; in
    the meantime the body works, or copies each page as it lands."""
    with files_named_on_fault(shard):
        if not shard.readahead:
            asked = None
            yield
        elif not behind:
            asked = read_ahead(shard, ids)
            yield
        else:  # probed here: the body's first reads must not make the cold look resident
            flat = cold_rows(shard, ids)
            pending = None if flat is None else reader().submit(ask_for, shard, flat)
            try:
                yield
            finally:  # the mapping and ids stay ours until the requests are made, the body's error or not
                asked = None if pending is None else finished([pending], shard)[0]
    if budget is not None:
        budget.after_lookup(shard, ids, None if asked is None else asked.bytes)


READAHEAD_TIMEOUT_S = 600  # a read-ahead's requests outlasting this: the device has stopped answering
WAIT_MARGIN_S = 30  # a direct read gives up after READAHEAD_TIMEOUT_S itself: its waiter waits that long
_readers: dict[int, ThreadPoolExecutor] = {}


def finished(pending: list[Future[Asked]], shard: TableShard) -> list[Asked]:
    """What each read or read-ahead handed to the read-ahead thread did, once every one is done (each
    waited for at most READAHEAD_TIMEOUT_S, and a little more for direct reads, which give up then
    themselves); the first error among them raised once all are."""
    results: list[Asked] = []
    error: BaseException | None = None
    for job in pending:
        try:
            results.append(job.result(timeout=READAHEAD_TIMEOUT_S + WAIT_MARGIN_S))
        except TimeoutError:
            names = ", ".join(str(m.path) for m in shard.files)
            error = error or EngramError(
                f"{names}: the disk took over {READAHEAD_TIMEOUT_S} s to answer; check the device (dmesg), "
                "or put the file on a disk that answers"
            )
        except BaseException as exc:
            error = error or exc
    if error is not None:
        raise error
    return results


def reader() -> ThreadPoolExecutor:
    """This process's read-ahead thread (a forked child makes its own: the parent's thread is not in it)."""
    pid = os.getpid()
    if pid not in _readers:
        _readers.clear()
        _readers[pid] = ThreadPoolExecutor(1, thread_name_prefix="engram-readahead")
    return _readers[pid]


DIRECT_DEPTH = 128  # reads in flight at once: the depth of the disk's request queue (nr_requests) here
DIRECT_MAX_RANGE = 64 << 10  # the most one read brings: DIRECT_DEPTH x this of buffers (8 MiB) a call
DIRECT_GAP = 0  # pages between rows are not read: a direct read keeps only the rows, so a gap is waste
_direct_warned: set[str] = set()


def mapping_of(shard: TableShard, address: int) -> Mapping | None:
    """The mapping of one of `shard`'s files that `address` lies in, or None (memory of its own)."""
    return next((m for m in shard.files if m.addr <= address < m.addr + m.length), None)


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


def stored_part_rows(shard: TableShard, part: Rows, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` (global ids) of a file-backed shard's `part`, as stored bytes, read by the guarded gather."""
    raw = part.view(torch.uint8)
    return GatherCall(raw, None, rows, shard.row_start, shard.row_stop, torch.uint8).run()


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
    """The checkpoint's one read-only mapping of `file`, made on first use (registered for UVA where it can be)."""
    mapped = checkpoint.mapped_files.get(file.path)
    if mapped is None:
        mapped = checkpoint.mapped_files[file.path] = map_file(file)
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
