"""Rows of a file-backed table whose pages are not resident, one run: layer 0's table of a V4.1-shaped
model (fp8 rows, 256 B + 8 B of scales) of --table-gb (default 4 GiB) in a safetensors file on this
machine's disk (ENGRAM_BENCH_DIR, default /var/tmp), looked up by engram's file-backed EngramEmbedding
(rows read in place: each lookup first asks for its rows' pages with MADV_WILLNEED, then the guarded
kernel gathers) with the page cache dropped before each call (posix_fadvise DONTNEED, after unmapping
our own pages) and kept warm; uniform ids and the n-gram ids of real text; a decode step (256 tokens x
24 heads) and a prefill chunk (8,192 tokens x 24 heads). Side by side in the same run: one pread per
distinct row from 16 threads (the plain way), and a sequential read of as many bytes as the distinct
rows' pages hold (what the device gives when the reads are not random).
Run: python benchmarks/bench_cold_rows.py [--table-gb N] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import struct
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from _timing import print_table

from engram.apps.corpus import load_corpus, text_rows
from engram.apps.presets import scaled_preset
from engram.memory.mapping import PAGE, madvise
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.filemap import file_shard
from engram.runtime.placement.residency import drop_file_cache
from engram.runtime.placement.storage import ShardFormat
from engram.runtime.plan import TableShardPlan

SHAPES = {"decode": 256, "prefill": 8192}
MADV_DONTNEED = 4


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


def pread_rows(path: Path, offsets: list[int], row_bytes: int) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda off: os.pread(fd, row_bytes, off), offsets, chunksize=64))
    finally:
        os.close(fd)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=4.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * args.table_gb * 2**30))  # layer 0's table is half
    rows, dim, name = spec.layout.table_rows[0], spec.head_dim, spec.table_names()[0]
    fmt = ShardFormat(rows, dim, "fp8")
    corpus = load_corpus().held_out
    results = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("ENGRAM_BENCH_DIR", "/var/tmp")) as tmp:
        path = Path(tmp) / "model.safetensors"
        write_table(path, name, rows, dim)
        shard = file_shard(name, fmt, 0, rows, Checkpoint(tmp), None)
        module = EngramEmbedding(shard, TableShardPlan(name, rows, "row", 0, rows, 0, 24), columns=24)
        mapped = [(m.addr, m.length) for m in shard.files]
        file = Checkpoint(tmp).files[f"{name}.weight"]
        weight_at = file.data_start + file.entries[f"{name}.weight"].begin
        for shape, tokens in SHAPES.items():
            text = text_rows(spec, corpus, tokens, 2)[1][:, 0]
            uniform = torch.randint(0, rows, text.shape, generator=torch.Generator().manual_seed(tokens))
            for source, ids in (("uniform", uniform), ("real text", text)):
                distinct = torch.unique(ids)
                offsets = [weight_at + r * dim for r in distinct.tolist()]  # fp8: dim bytes a row
                pages = torch.unique((weight_at + distinct * dim) // PAGE).numel()
                want = module(ids)
                lookup = functools.partial(module, ids)
                drop_cache(path, mapped)
                cold = seconds(lookup)
                assert torch.equal(module(ids).view(torch.int16), want.view(torch.int16))  # bit-exact either way
                warm = seconds(lookup)
                drop_cache(path, mapped)
                plain = seconds(functools.partial(pread_rows, path, offsets, dim))
                drop_cache(path, mapped)
                sequential = seconds(functools.partial(read_sequential, path, pages * PAGE))
                results.append(
                    {
                        "shape": shape,
                        "ids": source,
                        "lookups": ids.numel(),
                        "distinct_rows": distinct.numel(),
                        "pages": pages,
                        "engram_cold_ms": cold * 1e3,
                        "engram_warm_ms": warm * 1e3,
                        "pread_per_row_ms": plain * 1e3,
                        "sequential_same_pages_ms": sequential * 1e3,
                        "cold_page_reads_per_s": pages / cold,
                    }
                )
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"file-backed fp8 table of {args.table_gb:g} GiB on disk, rows not resident (cold) or resident (warm):")
    print_table(
        ["shape", "ids", "lookups", "distinct", "pages", "engram cold", "engram warm", "pread/row x16", "sequential", "cold pages/s"],
        [
            [
                r["shape"], r["ids"], f"{r['lookups']:,}", f"{r['distinct_rows']:,}", f"{r['pages']:,}",
                f"{r['engram_cold_ms']:.1f} ms", f"{r['engram_warm_ms']:.2f} ms", f"{r['pread_per_row_ms']:.1f} ms",
                f"{r['sequential_same_pages_ms']:.1f} ms", f"{r['cold_page_reads_per_s']:,.0f}",
            ]
            for r in results
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
