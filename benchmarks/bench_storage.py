"""Storage, one run: (1) load throughput from a page-cached safetensors file into shared storage against a
plain sequential read of the same file (target >= 0.5x); (2) time for a replica to attach to a shared
table against the table's size (flat: mapping, not copying); (3) summed table PSS over DP = 1, 2, 4
replicas, shared against private. Run: python benchmarks/bench_storage.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from _storage_workers import replica_pss
from _timing import median_seconds, print_table

from engram.memory.mapping import map_shared_file
from engram.presets import get_preset
from engram.runtime import dist as edist
from engram.runtime.checkpoint import write_checkpoint
from engram.runtime.launch import free_port, run_local, values
from engram.runtime.loader import Checkpoint, load_shards
from engram.runtime.shm import shm_dir
from engram.runtime.tables import allocate_shards, whole_tables

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


if __name__ == "__main__":
    main()
