"""engram_read_direct_cpu and filemap's direct reads: rows of a file on disk read past the page cache
(O_DIRECT through io_uring) into the slots asked for, equal to the file's bytes as Python's own reads
see them, coalesced into the ranges the header's rule gives (a plain model of it), with the page cache
left without a page of the file. Bad arguments are refused before any read, a file that shrank is a short
read named as such, and a shard whose direct reads fail or read wrong is served through the page cache."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import random
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engram.errors import EngramError
from engram.memory.mapping import PAGE
from engram.ops import cpu
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement import direct_reads
from engram.runtime.placement.direct_reads import direct_file, direct_reads_work, read_direct
from engram.runtime.placement.filemap import file_shard, in_memory_fs
from engram.runtime.placement.residency import drop_file_cache, resident_bytes
from engram.runtime.shard import ShardFormat, TableShard
from tests.runtime.placement.budget_table import DIM, ROWS, table
from tests.runtime.placement.reference import ALIGN, direct_ranges

SENTINEL = 0xAB


def library() -> ctypes.CDLL:
    lib = cpu.cpu_library()
    if lib is None:
        pytest.skip("no C compiler: the CPU kernels are not built")
    return lib


@pytest.fixture
def on_disk(tmp_path: Path) -> Path:
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs: nothing is read past a page cache there")
    return tmp_path


def direct_fd(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError as exc:
        pytest.skip(f"this file system refuses O_DIRECT: {exc.strerror}")


def call(
    fd: int, size: int, offset: int, shard_rows: int, row_bytes: int, rows: list[int], slots: list[int],
    dst: torch.Tensor, *, gap: int = PAGE, most: int = 64 << 10, depth: int = 128, timeout_ms: int = 60_000,
) -> tuple[int, int, int, int]:  # fmt: skip
    """The kernel's (status, ranges, bytes, os_error) for reading `rows` into dst's `slots`."""
    local, where = torch.tensor(rows, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64)
    ranges, nbytes, error = ctypes.c_int64(-1), ctypes.c_int64(-1), ctypes.c_int64(-1)
    status = library().engram_read_direct_cpu(
        (ctypes.c_int * 1)(fd), cpu.int64s([size]), cpu.int64s([offset]), cpu.int64s([0]), 1, shard_rows, row_bytes,
        cpu.ptr(local), cpu.ptr(where), local.numel(), dst.data_ptr(), dst.shape[0], gap, most, depth, timeout_ms,
        ctypes.byref(ranges), ctypes.byref(nbytes), ctypes.byref(error),
    )  # fmt: skip
    return status, ranges.value, nbytes.value, error.value


@pytest.mark.parametrize(
    ("row_bytes", "offset", "gap", "most", "depth"),
    [
        (264, 777, PAGE, 64 << 10, 128),  # V4.1's fp8 rows with scales, straddling pages, an unaligned part
        (264, 0, 0, ALIGN, 1),  # no coalescing, one read at a time
        (4096, 4096, PAGE, 8 * ALIGN, 3),
        (5000, 12, 2 * PAGE, ALIGN, 7),  # rows longer than a range's most: one row a read
        (1, 5, PAGE, ALIGN, 2),
    ],
)
def test_rows_read_past_the_page_cache_are_the_files_bytes(
    on_disk: Path, row_bytes: int, offset: int, gap: int, most: int, depth: int
) -> None:
    shard_rows = 3000
    path = on_disk / "table.bin"
    data = random.Random(row_bytes).randbytes(offset + shard_rows * row_bytes + 100)
    path.write_bytes(data)
    fd = direct_fd(path)
    try:
        assert drop_file_cache(path)
        generator = random.Random(offset + depth)
        for count in (1, 17, 600, shard_rows):
            rows = sorted(generator.sample(range(shard_rows), count))
            rows[-1] = shard_rows - 1 if count > 1 else rows[-1]  # the last row, next to the file's end
            rows = sorted(set(rows))
            dst_rows = len(rows) + 5
            slots = generator.sample(range(dst_rows), len(rows))
            dst = torch.full((dst_rows, row_bytes), SENTINEL, dtype=torch.uint8)
            status, ranges, nbytes, error = call(
                fd, len(data), offset, shard_rows, row_bytes, rows, slots, dst, gap=gap, most=most, depth=depth
            )
            assert (status, error) == (0, 0)
            assert (ranges, nbytes) == direct_ranges(len(data), offset, row_bytes, rows, gap, most)
            for row, slot in zip(rows, slots, strict=True):
                start = offset + row * row_bytes
                assert bytes(dst[slot].tolist()) == data[start : start + row_bytes], (row, slot)
            untouched = sorted(set(range(dst_rows)) - set(slots))
            assert bool((dst[untouched] == SENTINEL).all())
        assert resident_bytes_of(path) == 0  # the page cache gained no page of the file
    finally:
        os.close(fd)


def resident_bytes_of(path: Path) -> int:
    """Bytes of `path` in the page cache, through a mapping of our own (mincore)."""
    from engram.memory.mapping import map_readonly_file

    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = map_readonly_file(fd, path.stat().st_size, str(path))
    finally:
        os.close(fd)
    try:
        return resident_bytes((mapping,))
    finally:
        mapping.release()


def test_bad_arguments_are_refused_before_any_read(on_disk: Path) -> None:
    path = on_disk / "table.bin"
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB: 64 rows of 256 B
    fd = direct_fd(path)
    size = path.stat().st_size
    dst = torch.full((4, 256), SENTINEL, dtype=torch.uint8)
    try:
        assert call(fd, size, 0, 64, 256, [1, 2], [0, 3], dst)[0] == 0
        dst.fill_(SENTINEL)
        for rows, slots, shard_rows, offset, more in [
            ([2, 1], [0, 1], 64, 0, {}),  # not ascending
            ([1, 1], [0, 1], 64, 0, {}),  # twice
            ([64], [0], 64, 0, {}),  # past the shard
            ([-1], [0], 64, 0, {}),
            ([1], [4], 64, 0, {}),  # past dst
            ([1], [-1], 64, 0, {}),
            ([1], [0], 65, 0, {}),  # a shard running past the file's end
            ([1], [0], 64, 1, {}),
            ([1], [0], 64, 0, {"most": 5000}),  # a range's most, not a multiple of 4096
            ([1], [0], 64, 0, {"depth": 0}),
            ([1], [0], 64, 0, {"timeout_ms": 0}),
            ([1], [0], 64, 0, {"gap": -1}),
        ]:
            assert call(fd, size, offset, shard_rows, 256, rows, slots, dst, **more)[0] == 1, (rows, slots, more)
        assert bool((dst == SENTINEL).all())
        assert call(-1, size, 0, 64, 256, [1], [0], dst)[0] == 1
        assert call(fd, size, 0, 64, 256, [], [], dst)[:3] == (0, 0, 0)
    finally:
        os.close(fd)


def test_a_file_that_shrank_is_a_short_read(on_disk: Path) -> None:
    """Rows past a file's new end come back short: ENGRAM_ERR_IO with os_error 0, and the rows before it
    are still the file's."""
    path = on_disk / "table.bin"
    data = random.Random(3).randbytes(64 * ALIGN)
    path.write_bytes(data)
    fd = direct_fd(path)
    try:
        os.truncate(path, 8 * ALIGN)
        dst = torch.full((2, 256), SENTINEL, dtype=torch.uint8)
        status, _, _, error = call(fd, len(data), 0, len(data) // 256, 256, [0, 60 * 16], [0, 1], dst, gap=0)
        assert (status, error) == (cpu.STATUS_IO, 0)
        assert bytes(dst[0].tolist()) == data[:256]
    finally:
        os.close(fd)


@pytest.fixture
def shard(on_disk: Path) -> TableShard:
    shard = file_shard("t", ShardFormat(ROWS, DIM, "bf16"), 0, ROWS, Checkpoint(table(on_disk)), None)
    if not direct_file(shard, shard.weight):
        pytest.skip("this file system refuses O_DIRECT")
    return shard


def test_a_shards_rows_read_directly_are_the_checkpoints(shard: TableShard, on_disk: Path) -> None:
    """Through direct_reads.read_direct, against safetensors' own reader; the file's pages stay out of the page
    cache, and the bytes read are those asked for."""
    for mapping in shard.files:
        assert mapping.path is not None and drop_file_cache(mapping.path, file_id=mapping.file_id)
    rows = torch.tensor(sorted(random.Random(1).sample(range(ROWS), 300)))
    slots = torch.randperm(400, generator=torch.Generator().manual_seed(2))[:300]
    into = torch.zeros(400, DIM, dtype=shard.weight.dtype)
    asked = read_direct(shard, shard.weight, rows, slots, into)
    assert resident_bytes(shard.files) == 0
    offset, size = shard.weight.data_ptr() - shard.files[0].addr, shard.files[0].size
    assert asked == direct_ranges(
        size, offset, DIM * 2, rows.tolist(), direct_reads.DIRECT_GAP, direct_reads.DIRECT_MAX_RANGE
    )
    stored = load_file(on_disk / "model.safetensors")["t.weight"]
    assert torch.equal(into[slots].view(torch.int16), stored[rows].view(torch.int16))
    assert direct_reads_work(shard)


def test_a_shard_whose_file_shrank_is_named(shard: TableShard, on_disk: Path) -> None:
    path = on_disk / "model.safetensors"
    size = path.stat().st_size
    os.truncate(path, size // 2)
    rows = torch.tensor([ROWS - 1])
    into = torch.zeros(1, DIM, dtype=shard.weight.dtype)
    with pytest.raises(EngramError, match=f"^{path}: truncated at offset {size // 2:,}: the checkpoint shrank"):
        read_direct(shard, shard.weight, rows, torch.zeros(1, dtype=torch.int64), into)


def test_direct_reads_that_fail_or_read_wrong_leave_the_page_cache_to_serve(
    shard: TableShard, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(direct_reads, "_direct_warned", set())
    monkeypatch.setattr(direct_reads, "read_direct", lambda *a: (_ for _ in ()).throw(EngramError("no io_uring here")))
    with caplog.at_level(logging.WARNING, "engram"):
        assert not direct_reads_work(shard)
        assert not direct_reads_work(shard)  # said once per file
    path = shard.files[0].path
    assert [r.getMessage() for r in caplog.records] == [
        f"engram: {path} is read through the page cache, not past it: no io_uring here"
    ]
    monkeypatch.setattr(direct_reads, "_direct_warned", set())
    monkeypatch.setattr(direct_reads, "read_direct", lambda shard, part, rows, slots, into: into.fill_(1))
    caplog.clear()
    with caplog.at_level(logging.WARNING, "engram"):
        assert not direct_reads_work(shard)
    assert caplog.records[0].getMessage().endswith("not past it: the bytes read differ from the file's")


def test_direct_reads_can_be_turned_off_and_their_descriptor_goes_with_the_mapping(
    on_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = table(on_disk)
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")
    off = file_shard("t", ShardFormat(ROWS, DIM, "bf16"), 0, ROWS, Checkpoint(checkpoint), None)
    assert off.readahead and off.files[0].direct_fd is None and not direct_reads_work(off)
    monkeypatch.delenv("ENGRAM_DIRECT_READS")
    on_checkpoint = Checkpoint(checkpoint)
    on = file_shard("t", ShardFormat(ROWS, DIM, "bf16"), 0, ROWS, on_checkpoint, None)
    fd = on.files[0].direct_fd
    if fd is None:
        pytest.skip("this file system refuses O_DIRECT")
    assert os.readlink(f"/proc/self/fd/{fd}") == str(on_disk / "model.safetensors")
    on.release()
    del on, on_checkpoint  # the checkpoint's mappings go with it
    import gc

    gc.collect()
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != str(
        on_disk / "model.safetensors"
    )


def test_a_read_that_never_completes_is_given_up_after_the_timeout() -> None:
    """A read that never comes back (here from an empty pipe, as from a device that stopped answering)
    ends the call with ETIMEDOUT once timeout_ms have passed, nothing written to the caller's rows; the
    read left in flight lands, if ever, in the kernel function's own buffers."""
    read_end, write_end = os.pipe()
    try:
        dst = torch.full((1, 256), SENTINEL, dtype=torch.uint8)
        status, _, _, error = call(read_end, 1 << 20, 0, 16, 256, [0], [0], dst, depth=1, timeout_ms=200)
        assert (status, error) == (cpu.STATUS_IO, errno.ETIMEDOUT)
        os.write(write_end, bytes(ALIGN))  # what the abandoned read may still take: not the caller's memory
        assert bool((dst == SENTINEL).all())
    finally:
        os.close(read_end)
        os.close(write_end)


def io_uring_fds() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[io_uring]"
    return count


def test_a_thread_keeps_one_ring_across_calls_and_a_new_one_after_a_failure(on_disk: Path) -> None:
    """A thread's ring is set up on its first call and kept (one descriptor, whatever the calls), made
    anew for another depth, and dropped after a failed call; rows bit-equal throughout."""
    row_bytes, shard_rows = 512, 256
    path = on_disk / "table.bin"
    data = random.Random(3).randbytes(shard_rows * row_bytes)
    path.write_bytes(data)
    fd = direct_fd(path)
    done: list[int] = []

    def calls() -> None:  # on a thread of its own: the test's own thread may hold a ring from other tests
        for depth in (8, 8, 8, 16, 16):
            dst = torch.zeros((4, row_bytes), dtype=torch.uint8)
            status, _, _, error = call(
                fd, len(data), 0, shard_rows, row_bytes, [1, 50, 99, 200], [0, 1, 2, 3], dst, depth=depth
            )
            assert (status, error) == (0, 0)
            assert bytes(dst.view(-1).tolist()) == b"".join(
                data[r * row_bytes : (r + 1) * row_bytes] for r in (1, 50, 99, 200)
            )
            done.append(io_uring_fds())
        write_only = os.open(path, os.O_WRONLY | os.O_CLOEXEC)  # a read of it fails (EBADF): its ring goes too
        try:
            failed = call(
                write_only,
                len(data),
                0,
                shard_rows,
                row_bytes,
                [1],
                [0],
                torch.zeros((1, row_bytes), dtype=torch.uint8),
            )
        finally:
            os.close(write_only)
        assert (failed[0], failed[3]) == (cpu.STATUS_IO, errno.EBADF)
        done.append(io_uring_fds())

    before = io_uring_fds()
    worker = threading.Thread(target=calls)
    worker.start()
    worker.join(120)
    os.close(fd)
    assert done == [before + 1] * 5 + [before]
    assert io_uring_fds() == before  # the thread's ring went with the thread
