"""A resident-set budget for file-backed tables (file_cache_bytes): the page cache a table's lookups keep
resident stays near a bound, so a table bigger than RAM does not push the serving process, or its
neighbours, out of memory. The footprint is measured, not guessed: mincore over the file mappings, taken
only when the pages the lookups since the last measure could have added might cross the budget. Past
it, the mappings' pages are released (MADV_DONTNEED, then POSIX_FADV_DONTNEED on the file, which drops
what no other process maps), all but those of each table's latest lookup when they fit in half the
budget: the rows a step just read are the likeliest to be read again (hot n-grams), so the next step
does not start cold; other rows are read again when asked for. Pages that other processes keep
mapped stay. The replicas of a node that read the same files share their page cache, and each measures
all of it, so the bound is the node's: past it, every rank releases what it holds."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from engram.memory.mapping import PAGE, Mapping, madvise
from engram.ops.segments import Rows, row_addresses

if TYPE_CHECKING:
    from engram.runtime.shard import TableShard

log = logging.getLogger(__name__)
MADV_DONTNEED = 4
RESIDENCY_PROBES = 16  # pages a lookup of a file on disk probes before deciding to ask for all of its rows
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


_one_page = ctypes.c_ubyte()
_LOW_BIT = bytes(i & 1 for i in range(256))  # mincore's other bits are reserved


def page_resident(addr: int) -> bool:
    """Whether the page at the page-aligned `addr` is in the page cache (False where it is not mapped);
    one mincore call and no allocation, for the probes every lookup makes."""
    return _libc.mincore(ctypes.c_void_p(addr), PAGE, ctypes.byref(_one_page)) == 0 and bool(_one_page.value & 1)


def resident_pages(addr: int, length: int) -> bytes:
    """A byte per page of [addr, addr + length), 1 where the page is in the page cache and 0 where it is
    not (one mincore call; `addr` page-aligned); all 0 where the range is not mapped. Plain bytes, not a
    tensor: a torch op's thread team costs milliseconds when replicas share the cores."""
    vector = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
    if _libc.mincore(ctypes.c_void_p(addr), length, vector) != 0:
        return bytes(len(vector))
    return bytes(vector).translate(_LOW_BIT)


def resident_bytes(mappings: tuple[Mapping, ...]) -> int:
    """Bytes of these mappings whose pages are in the page cache."""
    return sum(resident_pages(m.addr, m.length).count(1) for m in mappings) * PAGE


class ResidentBudget:
    """Keeps the page cache of the files it watches near `budget_bytes` across lookups (after_lookup)."""

    def __init__(self, budget_bytes: int) -> None:
        self.mappings: tuple[Mapping, ...] = ()
        self.budget = budget_bytes
        self.page_span = 0  # the most pages one row's read can touch, scales alike
        self.resident = 0
        self.unmeasured = 0  # bytes the lookups since the last measure may have brought in
        self.trims = 0
        self.measures = 0  # mincore passes over the mappings after lookups (each reads a byte a page)
        self.peak = 0  # the most measured after a lookup
        self.latest: dict[int, tuple[TableShard, torch.Tensor]] = {}  # each table's latest ids, kept on release

    def watch(self, files: tuple[Mapping, ...], read_bytes: int) -> None:
        """Bound these file mappings too (each once, however many tables are views of it); `read_bytes`:
        the most bytes reading one row of their tables may bring in."""
        known = {m.addr for m in self.mappings}
        new = tuple({m.addr: m for m in files if m.addr not in known}.values())
        self.mappings += new
        self.page_span = max(self.page_span, (read_bytes + PAGE - 1) // PAGE + 1)
        self.resident += resident_bytes(new)

    def after_lookup(self, shard: TableShard, ids: torch.Tensor, asked: int | None) -> None:
        """Count what a lookup of `ids` in `shard` may have added to the page cache, and measure when that
        could cross the budget. `asked`: the bytes its read-ahead asked for, every page it can add; None where it
        asked for nothing because its RESIDENCY_PROBES probes all found their pages resident, and then
        that share of the most its rows can touch is counted (a sample that all hits seldom hides more)."""
        self.latest[shard.weight.data_ptr()] = (shard, ids)
        most = ids.numel() * self.page_span * PAGE * 2  # weights and scales
        self.unmeasured += asked if asked is not None else most // RESIDENCY_PROBES
        if self.resident + self.unmeasured <= self.budget:
            return
        self.resident, self.unmeasured = resident_bytes(self.mappings), 0
        self.measures += 1
        self.peak = max(self.peak, self.resident)
        if self.resident > self.budget:
            self.release()

    def release(self) -> None:
        """Drop this process's pages of the files, and the page cache's where no one else maps them: all
        but the pages of each table's latest lookup, when those fit in half the budget."""
        keep = merged(
            torch.cat([page_spans(part, shard.row_start, ids) for shard, ids in self.latest.values() for part in
                       (shard.weight, shard.scale) if part is not None] or [torch.empty(0, 2, dtype=torch.int64)])
        )  # fmt: skip
        if int((keep[:, 1] - keep[:, 0]).sum()) > self.budget // 2:
            keep = keep[:0]
        for mapping in self.mappings:
            gaps = outside(keep, mapping.addr, mapping.addr + mapping.length)
            for lo, hi in gaps:
                madvise(lo, hi - lo, MADV_DONTNEED)
            spans = [(lo - mapping.addr, hi - lo) for lo, hi in gaps]
            if mapping.path and not drop_file_cache(mapping.path, spans, mapping.file_id):
                _gone(mapping.path)
        self.resident = resident_bytes(self.mappings)
        self.trims += 1


@functools.cache
def _gone(path: str) -> None:
    log.warning(
        "engram: %s was removed or replaced while its tables were mapped: the rows read stay those of the file "
        "that was mapped, but file_cache_bytes can no longer drop its page cache (restore the file and restart)",
        path,
    )


def page_spans(part: Rows, row_start: int, ids: torch.Tensor) -> torch.Tensor:
    """int64 [k, 2]: the page-aligned address ranges [start, stop) that the rows `ids` (global) of the
    shard view `part` (holding rows from row_start) lie in, one a row, in address order."""
    row_bytes = part.shape[1] * part.element_size()
    local = torch.unique(ids.reshape(-1).to(device="cpu", dtype=torch.int64)) - row_start
    local = local[(local >= 0) & (local < part.shape[0])]
    start = row_addresses(part, local)
    spans = torch.stack([start // PAGE * PAGE, (start + row_bytes + PAGE - 1) // PAGE * PAGE], 1)
    return spans[torch.argsort(spans[:, 0])]


def merged(spans: torch.Tensor) -> torch.Tensor:
    """Ranges [start, stop) joined where they overlap or touch, in address order."""
    if not spans.shape[0]:
        return spans
    spans = spans[torch.argsort(spans[:, 0], stable=True)]
    reach = torch.cummax(spans[:, 1], 0).values  # the furthest stop so far
    opens = torch.ones(spans.shape[0], dtype=torch.bool)
    opens[1:] = spans[1:, 0] > reach[:-1]
    first = torch.nonzero(opens).flatten()
    last = torch.cat([first[1:] - 1, torch.tensor([spans.shape[0] - 1])])
    return torch.stack([spans[first, 0], reach[last]], 1)


def outside(keep: torch.Tensor, lo: int, hi: int) -> list[tuple[int, int]]:
    """The parts of [lo, hi) that the merged ranges `keep` do not cover."""
    gaps, at = [], lo
    for start, stop in keep.tolist():
        if stop <= lo or start >= hi:
            continue
        if start > at:
            gaps.append((at, start))
        at = max(at, stop)
    return [*gaps, (at, hi)] if at < hi else gaps


def drop_file_cache(
    path: str | os.PathLike[str], ranges: Iterable[tuple[int, int]] = ((0, 0),), file_id: tuple[int, int] | None = None
) -> bool:
    """POSIX_FADV_DONTNEED on (offset, length) ranges of a file (default: all of it, length 0 meaning to
    its end): their pages that no process maps leave the page cache (written back first: a dirty page
    would stay; a checkpoint's are clean, and then this costs nothing). False, and nothing done, when the
    name no longer holds the regular file `file_id` (device, inode) names: removed, or replaced by another
    file, a FIFO or a device, whose pages are not ours to drop; the open never blocks."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (file_id is not None and (info.st_dev, info.st_ino) != file_id):
            return False
        os.fsync(fd)
        for offset, length in ranges:
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def storage_read_bytes() -> int:
    """Bytes this process (all its threads) has had read from storage so far: /proc/self/io's read_bytes,
    which counts page-cache misses and read-ahead alike, and no read the page cache served."""
    try:
        with open("/proc/self/io", "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class DiskReads:
    """What the reads of one file-backed table on disk bring in from storage, counted around them (a rank's
    lookups run one at a time, so its process's count is theirs); nothing for a table in memory."""

    def __init__(self, on_disk: bool) -> None:
        self.on_disk = on_disk
        self.bytes = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        before = storage_read_bytes() if self.on_disk else 0
        try:
            yield
        finally:
            if self.on_disk:
                self.bytes += storage_read_bytes() - before
