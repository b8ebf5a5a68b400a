"""engram_readahead_cpu: the pages of a lookup's rows, sorted and deduplicated, asked for as coalesced
ranges. The number of ranges is checked by hand on small cases and against a model of the rule on random
ids; on a file on disk, the pages of the ranges (and of nothing else) come into the page cache."""

from __future__ import annotations

import ctypes
import mmap
import time
from pathlib import Path

import pytest
import torch

from engram.memory.mapping import PAGE, madvise, map_readonly_file
from engram.ops import cpu
from engram.runtime.placement.filemap import MADV_RANDOM, in_memory_fs
from engram.runtime.placement.residency import drop_file_cache, resident_pages

WILLNEED_TIMEOUT_S = 30


def library() -> ctypes.CDLL:
    lib = cpu.cpu_library()
    if lib is None:
        pytest.skip("no C compiler: the CPU kernels are not built")
    return lib


def ranges_asked(
    base: int, shard_rows: int, row_bytes: int, row_start: int, ids: list[int], gap: int, most: int
) -> tuple[int, int]:
    """The kernel's (ranges, bytes) for these rows."""
    flat = torch.tensor(ids, dtype=torch.int64)
    scratch, ranges, nbytes = torch.full_like(flat, -7), ctypes.c_int64(-1), ctypes.c_int64(-1)
    status = library().engram_readahead_cpu(
        cpu.addresses([base]), cpu.int64s([0]), 1, shard_rows, row_bytes, row_start, cpu.ptr(flat), flat.numel(), gap,
        most, cpu.ptr(scratch), scratch.numel(), ctypes.byref(ranges), ctypes.byref(nbytes),
    )  # fmt: skip
    assert status == 0
    return ranges.value, nbytes.value


def model(
    base: int, shard_rows: int, row_bytes: int, row_start: int, ids: list[int], gap: int, most: int
) -> tuple[int, int]:
    """The rule as the header states it, written plainly: page spans of the shard's distinct rows in address
    order, joined when the next starts at most `gap` bytes after the range ends and the join is <= `most`."""
    spans: list[list[int]] = []
    for local in sorted({i - row_start for i in ids if i >= 0 and 0 <= i - row_start < shard_rows}):
        start = base + local * row_bytes
        first, end = start // PAGE * PAGE, -(-(start + row_bytes) // PAGE) * PAGE
        if spans and first <= spans[-1][1] + gap and end - spans[-1][0] <= most:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([first, end])
    return len(spans), sum(end - first for first, end in spans)


@pytest.fixture(scope="module")
def region() -> tuple[mmap.mmap, int]:
    memory = mmap.mmap(-1, 256 * PAGE)
    return memory, ctypes.addressof(ctypes.c_char.from_buffer(memory))


@pytest.mark.parametrize(
    ("ids", "gap", "most", "ranges", "pages"),
    [
        ([0, 1, 2], 0, 1 << 20, 1, 3),  # adjacent pages
        ([2, 0, 2, 0], 0, 1 << 20, 2, 2),  # repeats and order do not matter; one page between: two reads
        ([0, 2], PAGE, 1 << 20, 1, 3),  # ... unless a page's gap is allowed, and then it is read too
        ([0, 3], PAGE, 1 << 20, 2, 2),  # two pages between is more than the gap
        ([0, 1, 2, 3], 0, 2 * PAGE, 2, 4),  # a range stops at its most bytes
        ([5, -1, 400, 40, 39], 0, 1 << 20, 2, 2),  # DEAD_ID and rows outside the shard [0, 40) are skipped
        ([], 0, 1 << 20, 0, 0),
    ],
)
def test_ranges_by_hand(
    region: tuple[mmap.mmap, int], ids: list[int], gap: int, most: int, ranges: int, pages: int
) -> None:
    _, base = region
    assert ranges_asked(base, 40, PAGE, 0, ids, gap, most) == (ranges, pages * PAGE)


def test_ranges_follow_the_rule_for_any_rows(region: tuple[mmap.mmap, int]) -> None:
    """Unaligned bases, rows that straddle pages, a shard starting past row 0, duplicates and ids of other
    shards: the ranges and bytes equal the model's for seeded random lookups."""
    _, base = region
    generator = torch.Generator().manual_seed(5)
    for trial in range(300):
        row_bytes = int(torch.randint(1, 3 * PAGE, (1,), generator=generator))
        shard_rows = max(1, 200 * PAGE // row_bytes)
        row_start = int(torch.randint(0, 50, (1,), generator=generator))
        offset = int(torch.randint(0, PAGE, (1,), generator=generator))
        shard_rows = min(shard_rows, (256 * PAGE - offset) // row_bytes)
        n = int(torch.randint(0, 300, (1,), generator=generator))
        ids = torch.randint(-1, row_start + shard_rows + 20, (n,), generator=generator).tolist()
        gap = [0, PAGE, 3 * PAGE][trial % 3]
        most = [PAGE, 4 * PAGE, 1 << 20][trial // 3 % 3]
        args = (base + offset, shard_rows, row_bytes, row_start, ids, gap, most)
        assert ranges_asked(*args) == model(*args), args


def test_bad_arguments_are_refused_and_nothing_is_written(region: tuple[mmap.mmap, int]) -> None:
    _, base = region
    flat = torch.arange(10, dtype=torch.int64)
    ranges, nbytes = ctypes.c_int64(-1), ctypes.c_int64(-1)
    for scratch_n, gap, most, row_bytes in [(9, 0, PAGE, 8), (10, -1, PAGE, 8), (10, 0, 0, 8), (10, 0, PAGE, 0)]:
        scratch = torch.full((10,), -7, dtype=torch.int64)
        status = library().engram_readahead_cpu(
            cpu.addresses([base]), cpu.int64s([0]), 1, 40, row_bytes, 0, cpu.ptr(flat), 10, gap, most,
            cpu.ptr(scratch), scratch_n, ctypes.byref(ranges), ctypes.byref(nbytes),
        )  # fmt: skip
        assert status == 1
        assert (ranges.value, nbytes.value) == (-1, -1) and scratch.eq(-7).all()


def test_the_ranges_pages_and_only_those_come_into_the_page_cache(tmp_path: Path) -> None:
    """On disk, with MADV_RANDOM (no read-around): rows one page apart are read with the page between them,
    rows further apart are not joined, and pages no range covers stay out."""
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages never leave the page cache")
    path = tmp_path / "rows.bin"
    path.write_bytes(bytes(range(256)) * (64 * PAGE // 256))
    with open(path, "rb") as f:
        mapping = map_readonly_file(f.fileno(), 64 * PAGE, str(path))
    try:
        madvise(mapping.addr, mapping.length, MADV_RANDOM)
        drop_file_cache(path)
        assert list(resident_pages(mapping.addr, 64 * PAGE)) == [0] * 64
        rows = [10, 12, 30, 40, 41]  # one row a page: 10-12 joined over page 11, 30 alone, 40-41 joined
        assert ranges_asked(mapping.addr, 64, PAGE, 0, rows, PAGE, 1 << 20) == (3, 6 * PAGE)
        want = [int(page in {10, 11, 12, 30, 40, 41}) for page in range(64)]
        deadline = time.monotonic() + WILLNEED_TIMEOUT_S
        while list(resident_pages(mapping.addr, 64 * PAGE)) != want and time.monotonic() < deadline:
            time.sleep(0.01)  # the reads are asynchronous
        assert list(resident_pages(mapping.addr, 64 * PAGE)) == want
    finally:
        mapping.release()
