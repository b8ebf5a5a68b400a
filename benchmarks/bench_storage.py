"""Storage, one run: (1) load throughput from a page-cached safetensors file into shared storage against a
plain sequential read of the same file (target >= 0.5x); (2) time for a replica to attach to a shared
table against the table's size (flat: mapping, not copying); (3) summed table PSS over DP = 1, 2, 4
replicas, shared against private; (4) file-backed tables (file_backed=true) side by side with the copying
load: time from start to the first lookup (target <= 0.1x), summed table PSS over DP 2 and 4 with every
row read (target <= 1.15x one table), and CPU lookups from the page-cached file against a private host
table (target >= 0.8x). Run: python benchmarks/bench_storage.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _storage_workers import replica_pss
from _timing import median_seconds, print_table

from engram.apps.local_ranks import free_port, run_local, values
from engram.apps.presets import get_preset
from engram.memory.mapping import map_shared_file
from engram.ops import gather, gather_into
from engram.runtime import dist as edist
from engram.runtime.checkpoints.loader import Checkpoint, load_shards
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.shm import shm_dir
from engram.runtime.rank_tables import allocate_shards, open_tables, whole_tables

CHUNK = 64 << 20


def sequential_read(path: Path) -> float:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    start = time.perf_counter()
    with path.open("rb", buffering=0) as f:
        while f.readinto(view):
            pass
    return time.perf_counter() - start


def load_throughput(spec_name: str, checkpoint: Path) -> list[list[str]]:
    spec = get_preset(spec_name)
    file = next(checkpoint.glob("*.safetensors"))
    size = file.stat().st_size
    sequential_read(file)  # into the page cache
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1, timeout=timedelta(seconds=60)
    )
    group = edist.new_group([0], "bench")

    plans = whole_tables(spec)
    rows = {p.table: p.table_rows for p in plans}
    load_s, both_s = [], []
    for _ in range(5):
        start = time.perf_counter()
        shards = allocate_shards(spec, plans, "shm", group=group)
        allocated = time.perf_counter()
        load_shards(shards, rows, Checkpoint(checkpoint), group=group, progress=False)
        done = time.perf_counter()
        load_s.append(done - allocated)
        both_s.append(done - start)
        for shard in shards:
            shard.release()
    read_s = median_seconds(lambda: sequential_read(file), number=1, repeat=5)
    load, both = statistics.median(load_s), statistics.median(both_s)
    dist.destroy_process_group()
    return [
        ["sequential read (page cache)", f"{size / read_s / 1e9:.2f}", "1.00x"],
        ["load into shared storage", f"{size / load / 1e9:.2f}", f"{read_s / load:.2f}x"],
        ["reserve (fallocate) + load", f"{size / both / 1e9:.2f}", f"{read_s / both:.2f}x"],
    ]


def attach_times() -> list[list[str]]:
    rows = []
    for size in (64 << 20, 256 << 20, 1 << 30):
        with tempfile.NamedTemporaryFile(dir=shm_dir(), prefix="engram-bench-") as f:
            os.posix_fallocate(f.fileno(), 0, size)

            def attach(fd: int = f.fileno(), size: int = size) -> None:
                map_shared_file(fd, size, f.name).release()

            rows.append([f"{size >> 20} MiB", f"{median_seconds(attach, number=20) * 1e6:.1f}"])
    return rows


def pss_table(spec_name: str, checkpoint: Path) -> list[list[str]]:
    table = get_preset(spec_name).table_bytes
    rows = []
    for dp in (1, 2, 4):
        shared = sum(values(run_local(dp, replica_pss, get_preset(spec_name), str(checkpoint), "shm", timeout=600)))
        private = sum(values(run_local(dp, replica_pss, get_preset(spec_name), str(checkpoint), "host", timeout=600)))
        rows.append(
            [
                str(dp),
                f"{shared / 2**20:.1f}",
                f"{shared / table:.2f}x",
                f"{private / 2**20:.1f}",
                f"{private / table:.2f}x",
            ]
        )
    return rows


def first_lookup_seconds(spec_name: str, checkpoint: Path, placement: str) -> float:
    """Open the tables and look up one decode step's rows in each: start-up as an engine sees it."""
    spec = get_preset(spec_name)
    started = time.perf_counter()
    shards = open_tables(spec, Checkpoint(checkpoint), placement, progress=False)  # type: ignore[arg-type]
    for shard, rows in zip(shards, spec.layout.table_rows, strict=True):
        gather(shard.weight, shard.scale, torch.randint(0, rows, (4096,)), 0, rows, torch.bfloat16)
    elapsed = time.perf_counter() - started
    for shard in shards:
        shard.release()
    return elapsed


def file_backed(spec_name: str, checkpoint: Path) -> tuple[list[list[str]], list[list[str]], list[list[str]]]:
    for path in checkpoint.glob("*.safetensors"):
        sequential_read(path)  # the checkpoint is in the page cache, as the target says
    copy = statistics.median(first_lookup_seconds(spec_name, checkpoint, "host") for _ in range(5))
    mapped = statistics.median(first_lookup_seconds(spec_name, checkpoint, "file") for _ in range(5))
    start = [
        ["copying load (host)", f"{copy * 1e3:.1f}", "1.00x"],
        ["file-backed", f"{mapped * 1e3:.1f}", f"{mapped / copy:.3f}x"],
    ]
    table = get_preset(spec_name).table_bytes
    memory = []
    for dp in (2, 4):
        file_pss = sum(values(run_local(dp, replica_pss, get_preset(spec_name), str(checkpoint), "file", timeout=600)))
        memory.append([str(dp), f"{file_pss / 2**20:.1f}", f"{file_pss / table:.2f}x"])
    spec = get_preset(spec_name)
    tables = {p: open_tables(spec, Checkpoint(checkpoint), p, progress=False) for p in ("host", "file")}
    lookups = []
    for batch in (64 * 8, 8192 * 8):  # decode and prefill, 8 columns per token
        ids = [torch.randint(0, rows, (batch,)) for rows in spec.layout.table_rows]
        outs = [torch.empty((batch, spec.head_dim), dtype=torch.bfloat16) for _ in ids]

        def run(placement: str, ids: list[torch.Tensor] = ids, outs: list[torch.Tensor] = outs) -> None:
            for shard, i, out, rows in zip(tables[placement], ids, outs, spec.layout.table_rows, strict=True):
                gather_into(shard.weight, shard.scale, i, 0, rows, out)

        run("file"), run("host")  # warm
        host = median_seconds(lambda: run("host"), number=20)
        file = median_seconds(lambda: run("file"), number=20)
        lookups.append([str(batch), f"{host * 1e6:.0f}", f"{file * 1e6:.0f}", f"{host / file:.2f}x"])
    return start, memory, lookups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="demo")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="engram-bench-") as tmp:
        checkpoint = Path(tmp)
        write_checkpoint(get_preset(args.preset), checkpoint)
        size = get_preset(args.preset).table_bytes
        print(f"preset {args.preset}: {size:,} table bytes\n")
        print_table(["load path", "GB/s", "vs sequential read"], load_throughput(args.preset, checkpoint))
        print("target: load >= 0.5x sequential read (reserving the shared memory is a one-time cost, shown apart)\n")
        print_table(["shared table size", "attach us (map an existing file)"], attach_times())
        print()
        print_table(
            ["DP", "shared PSS MiB", "shared / table", "private PSS MiB", "private / table"],
            pss_table(args.preset, checkpoint),
        )
        start, memory, lookups = file_backed(args.preset, checkpoint)
        print()
        print_table(["start to first lookup", "ms", "vs copying load"], start)
        print("target: file-backed <= 0.1x the copying load, checkpoint in the page cache")
        print_table(["DP", "file-backed PSS MiB (every row read)", "file / table"], memory)
        print("target: <= 1.15x one table")
        print_table(["ids per lookup", "private host table us", "page-cached file us", "file speed vs host"], lookups)
        print("target: >= 0.8x")


if __name__ == "__main__":
    main()
