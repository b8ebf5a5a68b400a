"""Reads of a file-backed shard's rows through the page cache. A file on disk's pages may leave the page
cache at any time (more tables than RAM, memory pressure, a restart), so every lookup first probes a
sample of its rows' pages (mincore, RESIDENCY_PROBES of them) and, when any is out, asks for all its rows'
pages at once (MADV_WILLNEED), sorted, deduplicated and coalesced into ranges: the reads are then in
flight together, at the device's random-read rate, rather than one fault at a time (bench_cold_rows.py: a
cold decode step 16-20x faster than faulting; preads from a thread pool or io_uring reads into the page
cache were no faster for a lookup of the table itself). Asking may run on this process's read-ahead
thread while the lookup works (reading(behind=True)).

Also here: a RAM tier's private copy of a file's block scales (private_scales), read once from the file."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

import torch

from engram.errors import EngramError
from engram.memory.mapping import PAGE, madvise
from engram.ops import GatherCall, cpu
from engram.ops.segments import Rows, pieces_of, row_addresses
from engram.runtime.placement.file_changes import files_named_on_fault
from engram.runtime.placement.filemap import in_files
from engram.runtime.placement.residency import RESIDENCY_PROBES, ResidentBudget, page_resident
from engram.runtime.shard import TableShard

MADV_WILLNEED = 3
READAHEAD_GAP = PAGE  # rows at most this far apart are read as one range: one more page costs less than a read
READAHEAD_MAX_RANGE = 1 << 20  # ranges stay small enough that many are in flight at once


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


def stored_part_rows(shard: TableShard, part: Rows, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` (global ids) of a file-backed shard's `part`, as stored bytes, read by the guarded gather."""
    raw = part.view(torch.uint8)
    return GatherCall(raw, None, rows, shard.row_start, shard.row_stop, torch.uint8).run()


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
