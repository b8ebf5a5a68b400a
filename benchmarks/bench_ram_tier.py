"""A file-backed table four times larger than a memory limit, served to real-text decode and prefill
lookups: engram's RAM tier (ram_cache_bytes, rows admitted after every lookup, misses read from the disk
straight into the tier past the page cache, or with ENGRAM_DIRECT_READS=0 through the sorted, coalesced
read-ahead in batches) against the kernel's own page-cache LRU (the same file-backed table without
it), side by side in one run, each in a fresh cgroup v1 memory group of the same limit.

The table is layer 0's of a V4.1-shaped model (fp8 rows, 256 B + 8 B of scales) of --table-gb in a
safetensors file on this machine's disk (ENGRAM_BENCH_DIR, default /var/tmp). The memory limit is what
serving itself needs (measured first: the whole run with no limit, over a file whose pages the parent
holds, so that only the lookups' own memory is charged; the child makes its stream and mappings before it
joins the group) plus a quarter of the table: the memory left for rows, page cache or tier. The tier
takes --tier-share of it (0.9: reading past the page cache, it leaves the rest to a lookup's
transients). The stream is the corpus's held-out text, hashed with the real hasher, in decode steps (256 tokens x 24 heads) and every --prefill-every steps a prefill chunk (8,192 tokens).
Measured per step after a warm-up: the bytes the process read from storage (/proc/self/io), and the
decode step's time (and the CPU time of the thread that ran it: the rest is waiting for the disk) against
a model of it: its pages read at the disk's random-read rate plus the warm gather of the same ids. The
disk's rate drifts by a fifth within seconds on a shared machine, so it is measured during each run:
every PROBE_EVERY steps the run pauses while this (parent) process, outside the group, looks up a decode
step's worth of uniform rows of a table file of its own with its page cache dropped, through engram's
read path; a step's model takes the median of the nearest probes. Rows are bit-equal across the runs (a
digest of every lookup's output). Each run has one torch thread (OMP_NUM_THREADS=1 unless set), as vLLM
gives its workers: more would spin on a core the kernel's reads need.

Then the tier again, with each step's reads started before its lookup (Table.prefetch, as a step starts
every layer's), and a sleep of --overlap milliseconds between, standing for the model's work before the
layer (one run each): what remains of the step's wait for the disk after that overlap.

Then what the stream allows (_bounds), from its steps after the warm-up: the pages of the rows first
asked for (which every cache of rows reads), of a hindsight choice of the tier's rows, and of a hindsight
choice of pages in the same memory, each against the LRU's; and what recency alone reads (an LRU of the
tier's rows, and of twice as many): how much memory an online choice would need to come near hindsight.

Targets: disk pages read per step at most 0.5x the page-cache LRU's; decode step time within 1.1x of the model; the tier's own CPU (a decode
step's thread CPU less that of the warm gather of the same ids, which every path pays) at most 5 ms. Run as root on a machine with a writable cgroup v1 memory controller.
Run: python benchmarks/bench_ram_tier.py [--table-gb N] [--steps N] [--tier-share F] [--overlap MS,MS] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import BinaryIO

import torch
from _bounds import FilePages, distinct, first_asked, hindsight, pages_per_step, recency
from _scratch import scratch_dir
from _timing import print_table
from bench_cold_rows import drop_cache, write_table

from engram.apps.corpus import load_corpus
from engram.apps.presets import scaled_preset
from engram.memory.mapping import PAGE
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.residency import ResidentBudget, drop_file_cache, storage_read_bytes
from engram.runtime.shard import ShardFormat
from engram.runtime.table import open_table

CGROUP = Path("/sys/fs/cgroup/memory")
DECODE, PREFILL, COLUMNS = 256, 8192, 24
PROBE_EVERY = 32  # steps between two measures of the disk's rate
PROBE_NEAREST = 3  # a timed step's rate: the median of this many probes nearest to it
WAIT_S = 120  # for one step of a run, or one probe


def save_stream(path: Path, spec_bytes: int, steps: int, prefill_every: int) -> None:
    """The table's name and the ids of each step, in order, into `path`: decode steps with a prefill
    chunk every `prefill_every` steps, over the held-out corpus, hashed as one stream."""
    spec = scaled_preset("deepseek-v4.1-flash", spec_bytes)
    sizes = [PREFILL if prefill_every and i % prefill_every == 0 else DECODE for i in range(steps)]
    tokens = load_corpus().held_out[: sum(sizes)]
    rows = spec.hasher().hash(spec.compress(tokens))[:, 0].contiguous()  # layer 0's columns
    torch.save({"name": spec.table_names()[0], "rows": rows, "sizes": sizes}, path)


def warm_file(path: Path) -> None:
    """Read the whole file once from this process, so its pages are in the page cache and charged to this
    process's group, not to a child's."""
    with open(path, "rb", buffering=0) as f:
        while f.read(64 << 20):
            pass


def group_memory(group: str) -> str:
    """The group's anonymous memory and page cache now, in MiB."""
    stat = dict(line.split() for line in (CGROUP / group / "memory.stat").read_text().splitlines())
    peak = int((CGROUP / group / "memory.max_usage_in_bytes").read_text())
    return f"anonymous {int(stat['rss']) >> 20} MiB, page cache {int(stat['cache']) >> 20} MiB, peak {peak >> 20} MiB"


def child(args: argparse.Namespace) -> None:
    """One run inside the cgroup (argv: the directory, the policy, the tier's and page cache's bytes). The
    stream and the table's mapping are made first and the process joins the group after: what the group
    is charged is what serving costs (the tier, the lookups' buffers, the file's pages), not the set-up."""
    saved = torch.load(Path(args.child) / "stream.ids")
    name, steps = saved["name"], list(torch.split(saved["rows"], saved["sizes"]))
    checkpoint = Checkpoint(args.child)
    rows = checkpoint.files[f"{name}.weight"].entries[f"{name}.weight"].shape[0]
    budget = ResidentBudget(args.file_cache) if args.file_cache else None
    table = open_table(name, ShardFormat(rows, 256, "fp8"), "file", checkpoint=checkpoint, budget=budget)
    with open(CGROUP / args.group / "cgroup.procs", "w") as f:
        f.write(str(os.getpid()))
    if args.ram_tier:
        table.keep_hot(args.ram_tier, "cpu", "ram")
    digest = hashlib.sha256()
    per_step = []
    for i, ids in enumerate(steps):
        timed = ids.shape[0] == DECODE and i >= args.warmup and i % 8 == 1
        if args.probe and i >= args.warmup and i % PROBE_EVERY == 0:
            ask_for_probe(args.probe, i)
        if args.warm:  # no limit: the timed steps' lookups with every page resident (the second of two)
            if timed:
                table.lookup(ids)
                start, cpu = time.perf_counter(), time.thread_time()
                table.lookup(ids)
                per_step.append({"step": i, "seconds": time.perf_counter() - start, "cpu": time.thread_time() - cpu})
            continue
        before, cpu = storage_read_bytes(), time.thread_time()
        if args.overlap_ms is not None:  # reads started at the step's start, the model's work before the layer
            table.prefetch(ids)
            time.sleep(args.overlap_ms / 1e3)
        start = time.perf_counter()
        out = table.lookup(ids)
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        read = storage_read_bytes() - before
        digest.update(out.view(torch.uint8).numpy().data)  # no copy: a prefill's would be 100 MB more
        if i % 100 == 0 or ids.shape[0] == PREFILL:  # shown if the run fails: how far it got, what the group held
            print(f"step {i}: {group_memory(args.group)}", file=sys.stderr, flush=True)
        per_step.append(
            {"step": i, "tokens": ids.shape[0], "read": read, "seconds": elapsed, "cpu": cpu, "timed": timed}
        )
    stats = table.stats()
    tier = None if stats.tier is None else dataclasses.asdict(stats.tier)
    print(json.dumps({"steps": per_step, "digest": digest.hexdigest(), "tier": tier}))


def ask_for_probe(fds: str, step: int) -> None:
    """From the child: have the parent measure the disk now (`fds`: the request and answer pipes), and wait."""
    request, answer = (int(fd) for fd in fds.split(","))
    os.write(request, f"{step}\n".encode())
    if not select.select([answer], [], [], WAIT_S)[0] or os.read(answer, 1) != b"k":
        raise SystemExit("the parent did not measure the disk")


class DiskProbe:
    """The disk's random-read rate, in pages a second, measured from this process on a table file of its
    own (so that a run's page cache is left as it is): a decode step's ids of uniform rows with the file's
    page cache dropped, through engram's read path."""

    def __init__(self, directory: Path, table_gb: float) -> None:
        spec = scaled_preset("deepseek-v4.1-flash", int(2 * table_gb * 2**30))
        name, self.rows = spec.table_names()[0], spec.layout.table_rows[0]
        directory.mkdir()
        self.path = directory / "model.safetensors"
        write_table(self.path, name, self.rows, 256)
        self.table = open_table(name, ShardFormat(self.rows, 256, "fp8"), "file", checkpoint=Checkpoint(directory))
        self.probes = 0

    def rate(self) -> float:
        self.probes += 1
        ids = torch.randint(0, self.rows, (DECODE, COLUMNS), generator=torch.Generator().manual_seed(self.probes))
        drop_cache(self.path, [(m.addr, m.length) for m in self.table.shard.files])
        before, start = storage_read_bytes(), time.perf_counter()
        self.table.lookup(ids)
        return (storage_read_bytes() - before) / PAGE / (time.perf_counter() - start)

    def close(self) -> None:
        self.table.release()


def run_child(
    args: argparse.Namespace,
    directory: Path,
    limit: int,
    ram_tier: int,
    file_cache: int,
    *,
    warm: bool = False,
    cold: bool = True,
    probe: DiskProbe | None = None,
    overlap_ms: float | None = None,
) -> dict:
    """One run in a fresh group of `limit` bytes; with `probe`, the disk measured every PROBE_EVERY steps
    of it (the report's "rates": [step, pages a second] pairs); with `overlap_ms`, each step's reads
    started that long before its lookup (Table.prefetch, then a sleep for the model's work)."""
    if cold:
        drop_file_cache(directory / "model.safetensors")  # pages are charged to whoever read them first
    group = f"engram-bench-{uuid.uuid4().hex[:8]}"
    (CGROUP / group).mkdir()
    try:
        (CGROUP / group / "memory.limit_in_bytes").write_text(str(limit))
        command = [
            sys.executable, __file__, "--child", str(directory), "--group", group, "--table-gb", str(args.table_gb),
            "--steps", str(args.steps), "--prefill-every", str(args.prefill_every), "--warmup", str(args.warmup),
            "--ram-tier", str(ram_tier), "--file-cache", str(file_cache), *(["--warm"] if warm else []),
            *([] if overlap_ms is None else ["--overlap-ms", str(overlap_ms)]),
        ]  # fmt: skip
        request, answer = os.pipe(), os.pipe()  # the child asks on the first, the parent answers on the second
        command += ["--probe", f"{request[1]},{answer[0]}"] if probe else []
        rates = []
        with open(directory / "out.log", "w+") as out, open(directory / "err.log", "w+") as err:
            env = {"OMP_NUM_THREADS": "1", **os.environ}  # serving's threads, unless set: vLLM's workers have one
            child = subprocess.Popen(command, stdout=out, stderr=err, env=env, pass_fds=(request[1], answer[0]))
            os.close(request[1])
            os.close(answer[0])
            try:
                with os.fdopen(request[0], "rb", buffering=0) as asks, os.fdopen(answer[1], "wb", buffering=0) as to:
                    while (line := read_line(asks, child)) is not None:
                        assert probe is not None
                        rates.append([int(line), probe.rate()])
                        to.write(b"k")
                code = child.wait(timeout=WAIT_S)
            except (OSError, subprocess.TimeoutExpired):  # it died while measured, or hangs: its exit code says
                child.kill()
                code = child.wait(timeout=WAIT_S)
            finally:
                if child.poll() is None:  # the parent failed: the group can only go once the child has
                    child.kill()
                    child.wait(timeout=WAIT_S)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        if code != 0:
            raise SystemExit(f"the run failed (exit {code}, limit {limit:,} B):\n{stderr[-3000:]}")
        report = json.loads(stdout.splitlines()[-1])
        report["rates"] = rates
        report["peak"] = int((CGROUP / group / "memory.max_usage_in_bytes").read_text())
        report["failcnt"] = int((CGROUP / group / "memory.failcnt").read_text())
        return report
    finally:
        (CGROUP / group).rmdir()


def read_line(pipe: BinaryIO, child: subprocess.Popen) -> bytes | None:
    """The child's next request, or None once it has exited; a run silent for WAIT_S x 30 s is killed."""
    line, waited = b"", 0.0
    while not line.endswith(b"\n"):
        if select.select([pipe], [], [], 1.0)[0]:
            byte = pipe.read(1)
            if not byte:  # the child closed its end: it has exited
                return None
            line += byte
        else:
            waited += 1.0
            if waited > WAIT_S * 30:
                child.kill()
                raise SystemExit(f"the run did not end within {WAIT_S * 30} s")
    return line


def rate_near(rates: list[list[float]], step: int) -> float:
    """The disk's rate for a step: the median of the PROBE_NEAREST probes taken nearest to it."""
    return statistics.median(r for _, r in sorted(rates, key=lambda p: abs(p[0] - step))[:PROBE_NEAREST])


def summarise(report: dict, warm: dict, warmup: int) -> dict:
    steady = report["steps"][warmup:]
    decode = [s for s in steady if s["tokens"] == DECODE]
    warm_seconds = {s["step"]: s["seconds"] for s in warm["steps"]}
    warm_cpu = {s["step"]: s["cpu"] for s in warm["steps"]}
    timed = [s for s in decode if s["timed"]]
    model = [s["read"] / PAGE / rate_near(report["rates"], s["step"]) + warm_seconds[s["step"]] for s in timed]
    return {
        "pages_per_step": sum(s["read"] for s in steady) / PAGE / len(steady),
        "pages_per_decode_step": sum(s["read"] for s in decode) / PAGE / len(decode),
        "decode_ms": statistics.median(s["seconds"] for s in timed) * 1e3,
        "warm_ms": statistics.median(warm_seconds[s["step"]] for s in timed) * 1e3,
        "decode_cpu_ms": statistics.median(s["cpu"] for s in timed) * 1e3,
        "own_cpu_ms": statistics.median(s["cpu"] - warm_cpu[s["step"]] for s in timed) * 1e3,
        "model_ms": statistics.median(model) * 1e3,
        "time_over_model": sum(s["seconds"] for s in timed) / sum(model),
        "peak_mib": report["peak"] / 2**20,
        "failcnt": report["failcnt"],
        "digest": report["digest"],
        "tier": report["tier"],
        "disk_pages_per_s": statistics.median(r for _, r in report["rates"]),
    }


def bounds(directory: Path, warmup: int, tier_rows: int, memory: int) -> dict[str, float]:
    """Pages a step (over the steps after the warm-up) that the run's stream asks of the table's file at the
    least (_bounds): the rows first asked for, a hindsight choice of `tier_rows` rows, and of the pages
    `memory` holds; and through an LRU of `tier_rows` rows and of twice as many."""
    saved = torch.load(directory / "stream.ids")
    name = saved["name"]
    file = Checkpoint(directory).files[f"{name}.weight"]
    entry = file.entries[f"{name}.weight"]
    rows, row_bytes = entry.shape  # fp8: a byte a value
    pages = FilePages((file.data_start + entry.begin,), rows, row_bytes)
    steps = distinct([ids.numpy() for ids in torch.split(saved["rows"], saved["sizes"])])
    file_pages = -(-(file.data_start + entry.begin + rows * row_bytes) // PAGE)
    found = {
        "first_asked": pages_per_step(first_asked(steps, rows), pages),
        "hindsight_rows": pages_per_step(hindsight(steps, rows, tier_rows), pages),
        "hindsight_pages": pages_per_step(hindsight([pages.of(s) for s in steps], file_pages, memory // PAGE), None),
        "recency_rows": pages_per_step(recency(steps, tier_rows), pages),
        "recency_rows_2x": pages_per_step(recency(steps, 2 * tier_rows), pages),
    }
    return {k: statistics.mean(v[warmup:]) for k, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gb", type=float, default=2.0)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--prefill-every", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--tier-share", type=float, default=0.9, help="of the memory for rows, the RAM tier's")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--ram-tier", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--file-cache", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument(
        "--overlap", default="2,8", help="ms of the model's work before the layer, each a run of the tier with prefetch"
    )
    parser.add_argument("--overlap-ms", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    overlaps = [float(ms) for ms in args.overlap.split(",") if ms.strip()]
    if not os.access(CGROUP, os.W_OK) or not (CGROUP / "memory.limit_in_bytes").exists():
        raise SystemExit("needs a writable cgroup v1 memory controller (run as root)")
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * args.table_gb * 2**30))
    name, rows = spec.table_names()[0], spec.layout.table_rows[0]
    table_bytes = rows * ShardFormat(1, 256, "fp8").row_bytes
    with scratch_dir() as tmp:
        write_table(Path(tmp) / "model.safetensors", name, rows, 256)
        save_stream(Path(tmp) / "stream.ids", int(2 * args.table_gb * 2**30), args.steps, args.prefill_every)
        # Serving's own need: the whole run with no limit over a file whose pages this process holds (so
        # none is charged to the child's group): what is left is the lookups' buffers and temporaries.
        warm_file(Path(tmp) / "model.safetensors")
        probe = run_child(args, Path(tmp), 1 << 40, 0, 0, cold=False)
        memory = table_bytes // 4
        limit = probe["peak"] + memory
        warm = run_child(args, Path(tmp), 1 << 40, 0, 0, warm=True)
        disk = DiskProbe(Path(tmp) / "probe", args.table_gb)
        try:
            lru = run_child(args, Path(tmp), limit, 0, 0, probe=disk)
            tier = run_child(args, Path(tmp), limit, int(memory * args.tier_share), 0, probe=disk)
            ahead = {
                ms: run_child(args, Path(tmp), limit, int(memory * args.tier_share), 0, probe=disk, overlap_ms=ms)
                for ms in overlaps
            }
        finally:
            disk.close()
        held_rows = tier["tier"]["capacity_rows"] if tier["tier"] else 0
        least = bounds(Path(tmp), args.warmup, held_rows, memory)
    results = {"lru": summarise(lru, warm, args.warmup), "tier": summarise(tier, warm, args.warmup)}
    results["bounds"] = least
    results["prefetched"] = {str(ms): summarise(run, warm, args.warmup) for ms, run in ahead.items()}
    results["setup"] = {
        "table_bytes": table_bytes, "limit_bytes": limit, "process_bytes": probe["peak"], "memory_for_rows": memory,
    }  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"file-backed fp8 table of {table_bytes / 2**30:.2f} GiB, cgroup limit {limit / 2**20:.0f} MiB (the process's "
        f"{probe['peak'] / 2**20:.0f} MiB + {memory / 2**20:.0f} MiB: a quarter of the table); disk: {results['lru']['disk_pages_per_s']:,.0f} and "
        f"{results['tier']['disk_pages_per_s']:,.0f} random page reads/s (medians of each run's probes); {args.steps} steps after {args.warmup} of warm-up, a prefill chunk every {args.prefill_every}"
    )
    a, b = results["lru"], results["tier"]
    print_table(
        ["", "disk pages/step", "per decode step", "decode step", "its CPU", "model (misses at disk rate + warm)",
         "time/model", "peak MiB", "failcnt"],
        [
            [label, f"{r['pages_per_step']:.1f}", f"{r['pages_per_decode_step']:.1f}", f"{r['decode_ms']:.2f} ms",
             f"{r['decode_cpu_ms']:.2f} ms", f"{r['model_ms']:.2f} ms", f"{r['time_over_model']:.2f}x",
             f"{r['peak_mib']:.0f}", str(r["failcnt"])]
            for label, r in (("page-cache LRU", a), ("engram RAM tier", b))
        ],
    )  # fmt: skip
    ratio = b["pages_per_step"] / a["pages_per_step"] if a["pages_per_step"] else float("nan")
    print(f"disk pages per step, tier / LRU: {ratio:.2f}x (target <= 0.5x)")
    lru_pages = a["pages_per_step"] or float("nan")
    print(
        f"the least any cache could read of this stream: the rows first asked for, {least['first_asked']:.1f} pages a "
        f"step ({least['first_asked'] / lru_pages:.2f}x the LRU's: every cache of rows reads them); a hindsight choice "
        f"of the tier's rows {least['hindsight_rows']:.1f} ({least['hindsight_rows'] / lru_pages:.2f}x), of pages in "
        f"the same memory {least['hindsight_pages']:.1f} ({least['hindsight_pages'] / lru_pages:.2f}x)"
    )
    print(
        f"recency alone (an LRU of rows): the tier's {held_rows:,} rows read {least['recency_rows']:.1f} "
        f"({least['recency_rows'] / lru_pages:.2f}x the LRU of pages), twice as many {least['recency_rows_2x']:.1f} "
        f"({least['recency_rows_2x'] / lru_pages:.2f}x)"
    )
    print(f"decode step time / model: {b['time_over_model']:.2f}x (target <= 1.1x)")
    print(
        f"the tier's own CPU a decode step: {b['own_cpu_ms']:.2f} ms beyond the warm gather of the same ids "
        f"(target <= 5 ms; the whole step's: {b['decode_cpu_ms']:.2f} ms)"
    )
    held = b["tier"]
    if held is not None:
        print(
            f"the tier: {held['rows']:,} rows ({held['bytes'] / 2**20:.0f} MiB), {held['hits'] / held['lookups']:.1%} of lookups hit, "
            f"{held['admissions']:,} admissions, {held['evictions']:,} evictions"
        )
    waited = b["decode_ms"] - b["warm_ms"]  # the tier's step beyond its warm gather: waiting for the disk
    for ms, run in results["prefetched"].items():
        left = run["decode_ms"] - run["warm_ms"]
        print(
            f"reads started {float(ms):g} ms before the lookup (the model's work before the layer): the lookup "
            f"waits {left:.2f} ms beyond its warm gather, {left / waited:.0%} of the {waited:.2f} ms without; "
            f"the tier's own CPU {run['own_cpu_ms']:.2f} ms (prefetch and lookup), pages/step {run['pages_per_step']:.1f}"
        )
    digests = {a["digest"], b["digest"], *(run["digest"] for run in results["prefetched"].values())}
    print(f"rows bit-equal across the runs: {len(digests) == 1}")


if __name__ == "__main__":
    main()
