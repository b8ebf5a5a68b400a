"""Rows of a file-backed table whose pages are not resident, one run: layer 0's table of a V4.1-shaped
model (fp8 rows, 256 B + 8 B of scales) of --table-gb (default 4 GiB) in a safetensors file on this
machine's disk (ENGRAM_BENCH_DIR, default /var/tmp), looked up by engram's file-backed EngramEmbedding
(rows read in place: each lookup that finds a probed page out asks for all its rows' pages, sorted,
deduplicated and coalesced into ranges, with MADV_WILLNEED, then the guarded kernel gathers) with the
page cache dropped before each call (posix_fadvise DONTNEED, after unmapping our own pages) and kept
warm; uniform ids and the n-gram ids of real text; a decode step (256 tokens x 24 heads) and a prefill
chunk (8,192 tokens x 24 heads). Side by side in the same run, reading the same rows' bytes (weights and
scales) from C (benchmarks/native/cold_reads.c): one pread per row from 64 threads, the same reads
through io_uring with 128 in flight, and a sequential read of as many pages as the rows lie in (what
the device gives when the reads are not random). Each cold figure is the median of --rounds rounds
taken in turn.
Run: python benchmarks/bench_cold_rows.py [--table-gb N] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import statistics
import struct
import time
from collections.abc import Callable
from pathlib import Path

import torch
from _scratch import scratch_dir
from _timing import print_table

from engram.apps.corpus import load_corpus, text_rows
from engram.apps.presets import scaled_preset
from engram.errors import EngramError
from engram.memory.mapping import PAGE, madvise
from engram.ops import cpu
from engram.ops.build import build_library
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.file_reads import read_ahead
from engram.runtime.placement.filemap import file_shard
from engram.runtime.placement.residency import drop_file_cache
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import ShardFormat

SHAPES = {"decode": 256, "prefill": 8192}
MADV_DONTNEED = 4
NATIVE = Path(__file__).resolve().parent / "native" / "cold_reads.c"


def write_table(path: Path, name: str, rows: int, dim: int) -> None:
    """A safetensors file holding one fp8 table and its ue8m0 scales, filled from random blocks."""
    weight, scale = rows * dim, rows * (dim // 32)
    header = {
        f"{name}.weight": {"dtype": "F8_E4M3", "shape": [rows, dim], "data_offsets": [0, weight]},
        f"{name}.scale": {"dtype": "F8_E8M0", "shape": [rows, dim // 32], "data_offsets": [weight, weight + scale]},
    }
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    block = bytes(torch.randint(0, 120, (64 << 20,), dtype=torch.uint8).numpy())  # no NaN bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        written = 0
        while written < weight:
            written += f.write(block[: min(len(block), weight - written)])
        f.write(bytes([127]) * scale)  # every scale 2^0


def drop_cache(path: Path, shard_pages: list[tuple[int, int]]) -> None:
    for addr, length in shard_pages:  # our own mappings first: a mapped page cannot be dropped
        madvise(addr, length, MADV_DONTNEED)
    drop_file_cache(path)


def native_readers() -> ctypes.CDLL | None:
    """The C readers the benchmark sets beside engram, or None (said once) where they cannot be built."""
    flags = ["-O2", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-Wall", "-Wextra", "-Werror"]
    try:
        path = build_library("bench_cold_reads", [NATIVE], os.environ.get("CC", "cc"), flags)
    except EngramError as exc:
        print(f"the C readers are not built, so their columns are empty: {exc}")
        return None
    library = ctypes.CDLL(str(path))
    i64p = ctypes.POINTER(ctypes.c_int64)
    for name, last in (("bench_pread_pool", ctypes.c_int), ("bench_uring_reads", ctypes.c_uint)):
        getattr(library, name).argtypes = [ctypes.c_int, i64p, i64p, ctypes.c_int64, ctypes.c_int64, last]
    return library


def native_read(library: ctypes.CDLL, name: str, path: Path, extents: torch.Tensor, width: int) -> None:
    """Read every (offset, length) row of `extents` with the C reader `name` (width: threads or depth)."""
    offsets, lengths = extents[:, 0].contiguous(), extents[:, 1].contiguous()
    fd = os.open(path, os.O_RDONLY)
    try:
        status = getattr(library, name)(
            fd, cpu.ptr(offsets), cpu.ptr(lengths), offsets.numel(), int(lengths.max()), width
        )
    finally:
        os.close(fd)
    if status:
        raise OSError(-status, f"{name}: {os.strerror(-status)}")


def read_sequential(path: Path, nbytes: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < nbytes:
            done += len(os.pread(fd, min(64 << 20, nbytes - done), done)) or nbytes
    finally:
        os.close(fd)


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cold_medians(fns: dict[str, Callable[[], object]], drop: Callable[[], None], rounds: int) -> dict[str, float]:
    """Median seconds of each fn from a dropped page cache, the fns taken in turn each round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            drop()
            times[name].append(seconds(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * args.table_gb * 2**30))  # layer 0's table is half
    rows, dim, name = spec.layout.table_rows[0], spec.head_dim, spec.table_names()[0]
    fmt = ShardFormat(rows, dim, "fp8")
    corpus = load_corpus().held_out
    library = native_readers()
    results = []
    with scratch_dir() as tmp:
        path = Path(tmp) / "model.safetensors"
        write_table(path, name, rows, dim)
        shard = file_shard(name, fmt, 0, rows, Checkpoint(tmp), None)
        module = EngramEmbedding(shard, TableShardPlan(name, rows, "row", 0, rows, 0, 24), columns=24)
        mapped = [(m.addr, m.length) for m in shard.files]
        file = Checkpoint(tmp).files[f"{name}.weight"]
        weight_at = file.data_start + file.entries[f"{name}.weight"].begin
        scale_at = file.data_start + file.entries[f"{name}.scale"].begin
        drop = functools.partial(drop_cache, path, mapped)
        for shape, tokens in SHAPES.items():
            text = text_rows(spec, corpus, tokens, 2)[1][:, 0]
            uniform = torch.randint(0, rows, text.shape, generator=torch.Generator().manual_seed(tokens))
            for source, ids in (("uniform", uniform), ("real text", text)):
                distinct = torch.unique(ids)
                extents = torch.cat(
                    [
                        torch.stack([weight_at + distinct * dim, torch.full_like(distinct, dim)], 1),
                        torch.stack([scale_at + distinct * (dim // 32), torch.full_like(distinct, dim // 32)], 1),
                    ]
                )  # every distinct row's weight bytes, then its scale bytes
                first, last = extents[:, 0] // PAGE, (extents[:, 0] + extents[:, 1] - 1) // PAGE
                pages = torch.unique(torch.cat([first, last])).numel()
                want = module(ids)
                fns: dict[str, Callable[[], object]] = {"engram": functools.partial(module, ids)}
                fns["sequential"] = functools.partial(read_sequential, path, pages * PAGE)
                if library is not None:
                    fns["pread"] = functools.partial(native_read, library, "bench_pread_pool", path, extents, 64)
                    fns["io_uring"] = functools.partial(native_read, library, "bench_uring_reads", path, extents, 128)
                cold = cold_medians(fns, drop, args.rounds)
                drop()
                asked = read_ahead(shard, ids)  # the ranges engram asks for
                reads = asked.ranges if asked is not None else 0
                assert torch.equal(module(ids).view(torch.int16), want.view(torch.int16))  # bit-exact, cold or warm
                warm = statistics.median(seconds(fns["engram"]) for _ in range(5))
                results.append(
                    {
                        "shape": shape,
                        "ids": source,
                        "lookups": ids.numel(),
                        "distinct_rows": distinct.numel(),
                        "pages": pages,
                        "engram_reads": reads,
                        "engram_cold_ms": cold["engram"] * 1e3,
                        "engram_warm_ms": warm * 1e3,
                        "pread_per_row_64_threads_ms": cold["pread"] * 1e3 if "pread" in cold else None,
                        "io_uring_per_row_depth_128_ms": cold["io_uring"] * 1e3 if "io_uring" in cold else None,
                        "sequential_same_pages_ms": cold["sequential"] * 1e3,
                        "engram_cold_reads_per_s": reads / cold["engram"],
                    }
                )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"file-backed fp8 table of {args.table_gb:g} GiB on disk, rows not resident (cold, median of {args.rounds}) or resident (warm):"
    )
    ms = lambda v: "n/a" if v is None else f"{v:.1f} ms"  # noqa: E731
    print_table(
        ["shape", "ids", "lookups", "distinct", "pages", "engram reads", "engram cold", "engram warm",
         "pread/row x64", "io_uring/row d128", "sequential", "engram reads/s"],
        [
            [
                r["shape"], r["ids"], f"{r['lookups']:,}", f"{r['distinct_rows']:,}", f"{r['pages']:,}",
                f"{r['engram_reads']:,}", ms(r["engram_cold_ms"]), f"{r['engram_warm_ms']:.2f} ms",
                ms(r["pread_per_row_64_threads_ms"]), ms(r["io_uring_per_row_depth_128_ms"]),
                ms(r["sequential_same_pages_ms"]), f"{r['engram_cold_reads_per_s']:,.0f}",
            ]
            for r in results
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
