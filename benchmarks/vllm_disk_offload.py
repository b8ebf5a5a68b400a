"""vLLM 0.34's own disk path for Qwen4Exp's PLE tables (EngramConfig.disk_offload) against engram's
file-backed table of the same checkpoint, without and with a RAM tier, side by side in one run.

- "vllm": vLLM's Qwen4ExpPLEDiskOffloadEmbedding, imported from the installed vllm==0.34.0, bound to the
  checkpoint's `shard_<k>` parts by its own bind_file_shards and staged by its own copy_ids_to_host and
  stage_rows, what stage_checkpoint_rows calls for each PLE layer once the stream is synchronised: the
  step's distinct ids, posix_fadvise(WILLNEED) per page run, one os.preadv per row, the rows spread to
  their ids, then copied to the staging buffers. Host tensors stand in for its pinned and device ones,
  and there is no stream to synchronise (this machine has no GPU); nothing else is replaced.
- "engram": engram's plugin class for the same table (EngramQwenDiskOffloadEmbedding.stage_rows, what
  vLLM runs with engram enabled): the file-backed table over the same parts, its read-ahead per lookup.
- "engram+ram": the same with a RAM tier (ram_cache_bytes) of --tier-share of the memory the limit
  leaves for rows.

The table is a Qwen4Exp PLE layer's (bf16 rows of 80 values, 160 B) scaled to --table-gb, written as
--parts `shard_<k>` parts into one safetensors file on this machine's disk (ENGRAM_BENCH_DIR, default
/var/tmp). The ids are the held-out corpus hashed by engram's Qwen4Exp hasher (bit-exact with vLLM's), in
decode steps of 256 tokens and every --prefill-every steps a prefill chunk of 8,192 tokens; the hashing
is not timed on either side. Each run is one process, in three conditions: "warm" (every page of the
file in the page cache, no limit), "cold" (the file's pages dropped before the run, no limit) and
"limited" (dropped, and the process in a cgroup v1 memory group of what serving itself needs plus a
quarter of the table: the same memory for every contender). Measured per step after --warmup steps (400
by default: the RAM tier fills from empty, as the page cache does, over hundreds of steps): the
host time of the staging call (wall clock: the disk's waits included), its thread's CPU time, and the
bytes the process read from storage (/proc/self/io). Every run's staged bytes are checked against
safetensors' own reader of the parts, step by step (a digest). Runs alternate contenders, --repeat
times each; the figures are medians over steps, and the spread is over repeats.

Then what the stream allows (_bounds), over the steps after the warm-up, against vLLM's pages under the
limit: the pages of the rows first asked for (every cache of rows reads them, engram's RAM tier among
them), of a hindsight choice of the tier's rows, and of a hindsight choice of pages in the memory the limit
left vLLM's page cache. And how long the disk takes to give a decode step's rows first asked for: after
each repeat of the limited runs, this (parent) process reads every decode step's rows first asked for
(after the warm-up) from the disk with the RAM tier's own reader (filemap.read_direct: O_DIRECT through
io_uring, only the pages the rows lie in, none from the page cache), outside any group: the least a cache
of rows waits in a step, its median against vLLM's step's; the same for each prefill step's.

And the RAM tier's own figures: per condition its host time against the same table without it, run by
run (where memory is to spare it stands aside, and should cost nothing), and its own CPU per id served
(its step's CPU less the untiered one's); under the limit its host time against its floor, run by run:
the rows first asked for, read from the disk as above, plus its own step's CPU.

Your own checkpoint and text instead: --checkpoint DIR (a Qwen4Exp checkpoint whose PLE tables are stored
as `shard_<k>` parts, as vLLM's disk offload needs them; the first such table is served, or --table NAME;
rows of one plane: bf16, fp16, fp32 or fp8) and --text FILE (tokenized with the DeepSeek V4 tokenizer the
package ships, whose ids fit Qwen4Exp's vocabulary; hashed as that model's config says).

Run as root on a machine with a writable cgroup v1 memory controller, by the vLLM 0.34 venv's Python:
  .venv-vllm-0.34.0/bin/python benchmarks/vllm_disk_offload.py [--table-gb N] [--steps N] [--json]
  .venv-vllm-0.34.0/bin/python benchmarks/vllm_disk_offload.py --checkpoint DIR --text FILE
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch
from _bounds import FilePages, distinct, first_asked, hindsight, pages_per_step
from _scratch import scratch_dir
from _timing import print_table
from bench_ram_tier import warm_file

from engram.apps.corpus import load_corpus
from engram.apps.presets import get_preset
from engram.memory.mapping import PAGE
from engram.ngram.spec import ModelSpec
from engram.ngram.vocab import deepseek_v4_tokenizer
from engram.ops.formats import FORMATS
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.direct_reads import direct_reads_work, read_direct
from engram.runtime.placement.residency import drop_file_cache, storage_read_bytes
from engram.runtime.table import ShardFormat, open_table

CGROUP = Path("/sys/fs/cgroup/memory")
DECODE, PREFILL = 256, 8192
CONTENDERS = ("vllm", "engram", "engram+ram")
CONDITIONS = ("warm", "cold", "limited")
WAIT_S = 1800  # for one run


@dataclasses.dataclass(frozen=True)
class Source:
    """The table served: its checkpoint directory, the model's spec, the table's name and its layer's index
    among the model's PLE layers, its rows and row format, and its parts' rows."""

    directory: Path
    spec: ModelSpec
    name: str
    layer: int
    rows: int
    dtype: str
    part_rows: int


SAFETENSORS_FORMATS = {"BF16": "bf16", "F16": "fp16", "F32": "fp32", "F8_E4M3": "fp8-table"}


def scaled_qwen(table_gb: float) -> ModelSpec:
    """The Qwen4Exp PLE preset, its n-gram vocabulary scaled so its one table holds about `table_gb` GiB."""
    base = get_preset("qwen4-exp-ple")
    config = dict(base.hf_text_config)
    scale = table_gb * 2**30 / base.table_bytes
    config["ngram_vocab_size_base"] = max(1024, round(config["ngram_vocab_size_base"] * scale))
    return dataclasses.replace(base, name=f"qwen4-exp-ple@{table_gb}GiB", hf_text_config=config, multipliers={})


def source_of(directory: Path, table: str | None) -> Source:
    """The table of the checkpoint in `directory` (Source), from its config.json and its files' headers."""
    from safetensors import safe_open

    config = json.loads((directory / "config.json").read_text())
    spec = ModelSpec(directory.name, config["architectures"][0], config.get("text_config", config))
    if spec.family != "qwen":
        raise SystemExit(f"{directory} holds a {spec.architecture}: vLLM's disk offload serves Qwen4Exp only")
    names = spec.table_names()
    found: dict[str, list[tuple[int, str]]] = {}  # table -> its parts (index, dtype)
    for path in sorted(directory.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118
                stem, _, rest = key.rpartition(".shard_")
                if stem in names and rest.endswith(".weight"):
                    found.setdefault(stem, []).append((int(rest[: -len(".weight")]), handle.get_slice(key).get_dtype()))
    name = table or next((n for n in names if n in found), None)
    if name not in found:
        raise SystemExit(f"{directory} has no PLE table stored as shard_<k> parts{f' named {table}' if table else ''}")
    dtypes = {d for _, d in found[name]}
    if len(dtypes) != 1 or next(iter(dtypes)) not in SAFETENSORS_FORMATS:
        raise SystemExit(
            f"{name} is stored as {', '.join(sorted(dtypes))}; this benchmark stages bf16, fp16, fp32 or fp8 rows"
        )
    rows = spec.layout.table_rows[names.index(name)]
    parts = len(found[name])
    dtype = SAFETENSORS_FORMATS[dtypes.pop()]
    spec = dataclasses.replace(spec, dtype=dtype)  # its rows' bytes
    return Source(directory, spec, name, names.index(name), rows, dtype, -(-rows // parts))


def save_stream(path: Path, source: Source, tokens: torch.Tensor, steps: int, prefill_every: int) -> None:
    """Each step's ids [tokens, heads] of the table, in order, into `path`."""
    sizes = [PREFILL if prefill_every and i % prefill_every == prefill_every - 1 else DECODE for i in range(steps)]
    if tokens.numel() < sum(sizes):
        raise SystemExit(f"the text has {tokens.numel():,} tokens; {steps} steps need {sum(sizes):,}")
    if int(tokens.max()) >= source.spec.vocab:
        raise SystemExit(
            f"the text's token ids reach {int(tokens.max())}, past the model's vocabulary of {source.spec.vocab}"
        )
    hashed = source.spec.hasher().hash(source.spec.compress(tokens[: sum(sizes)]))
    ids = hashed[:, source.layer].contiguous()
    torch.save({"ids": ids, "sizes": sizes}, path)


def parts_of(source: Source) -> list[torch.Tensor]:
    """The table's `shard_<k>` parts, in order, as safetensors' own reader maps them (uint8 rows); each
    maps its file while it lives."""
    from safetensors import safe_open

    parts: dict[int, torch.Tensor] = {}
    for path in sorted(source.directory.glob("*.safetensors")):
        handle = safe_open(str(path), framework="pt")
        for key in handle.keys():  # noqa: SIM118
            stem, _, rest = key.rpartition(".shard_")
            if stem == source.name and rest.endswith(".weight"):
                parts[int(rest[: -len(".weight")])] = handle.get_tensor(key).view(torch.uint8)
    return [parts[k] for k in sorted(parts)]


def oracle_digest(source: Source, steps: list[torch.Tensor]) -> str:
    """The digest of every step's rows as safetensors' reader gives them: [tokens, heads, row bytes]. Its
    copy of the table and its mappings go when it returns, so that a cold run's pages can be dropped."""
    table = torch.cat(parts_of(source))
    digest = hashlib.sha256()
    for ids in steps:
        digest.update(table[ids.reshape(-1)].numpy().data)
    return digest.hexdigest()


def staging(module: torch.nn.Module, source: Source, tokens: int) -> None:
    """The host buffers vLLM's constructor makes for the table (pinned and device ones on a GPU)."""
    heads = source.spec.layout.columns
    module._host_ids = torch.empty((tokens, heads), dtype=torch.long)
    dtype = FORMATS[source.dtype].weight
    shape = (tokens, heads, source.spec.row_bytes // dtype.itemsize)
    host = torch.empty(shape, dtype=dtype)
    rows = torch.empty_like(host).view(torch.uint8).flatten(0, 1)
    module._planes = {"weight": (torch.zeros(shape, dtype=dtype), host, rows)}


def vllm_module(source: Source, tokens: int) -> torch.nn.Module:
    """vLLM 0.34's disk-offload table, bound to the checkpoint's parts by its own bind_file_shards."""
    from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpPLEDiskOffloadEmbedding

    module = Qwen4ExpPLEDiskOffloadEmbedding.__new__(Qwen4ExpPLEDiskOffloadEmbedding)
    torch.nn.Module.__init__(module)
    staging(module, source, tokens)
    module.org_vocab_size, module._shard_size = source.rows, source.part_rows
    module._bound, module._dummy, module._fds, module._sources = False, False, {}, {}
    module._shards = {"weight": dict(enumerate(parts_of(source)))}
    module.bind_file_shards()
    return module


def engram_module(source: Source, tokens: int, ram_tier: int) -> torch.nn.Module:
    """engram's plugin class for the same table (what vLLM runs with engram enabled), its file-backed table
    opened over the same parts, with a RAM tier of `ram_tier` bytes if not 0."""
    from engram.config import load_config
    from engram.integrations.vllm.qwen_disk import EngramQwenDiskOffloadEmbedding
    from engram.integrations.vllm.tables import Served
    from engram.runtime.table import Checkpoint, ShardFormat, open_table

    module = EngramQwenDiskOffloadEmbedding.__new__(EngramQwenDiskOffloadEmbedding)
    torch.nn.Module.__init__(module)
    staging(module, source, tokens)
    module.prefix = source.name
    module._engram = load_config({"cpu_offload": True, "file_backed": True, "ram_cache_bytes": ram_tier}, env={})
    fmt = ShardFormat(source.rows, source.spec.head_dim, source.dtype)
    table = open_table(source.name, fmt, "file", checkpoint=Checkpoint(source.directory), table_rows=source.rows)
    if ram_tier:
        table.keep_hot(ram_tier, "cpu", "ram")
    module.engram_table = table
    module._served = Served(module._engram, source.name, table, 1, tiered=False)
    return module


def child(args: argparse.Namespace) -> None:
    """One run (module docstring): the table is opened first and the process joins its group after, so
    that what the group is charged is serving's memory, not the set-up's."""
    source = source_of(Path(args.child), args.table)
    saved = torch.load(args.stream)
    steps = list(torch.split(saved["ids"], saved["sizes"]))
    tokens = max(saved["sizes"])
    if args.contender == "vllm":
        module = vllm_module(source, tokens)
    else:
        module = engram_module(source, tokens, args.ram_tier)
    if args.cold:  # the set-up read some of the file (safetensors' views of the parts): what it read goes again
        for path in source.directory.glob("*.safetensors"):
            drop_file_cache(path)
    if args.group:
        (CGROUP / args.group / "cgroup.procs").write_text(str(os.getpid()))
    digest, per_step = hashlib.sha256(), []
    for i, ids in enumerate(steps):
        before, start, cpu = storage_read_bytes(), time.perf_counter(), time.thread_time()
        module.copy_ids_to_host(ids)
        module.stage_rows(ids.shape[0])
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
        read = storage_read_bytes() - before
        digest.update(module._planes["weight"][1][: ids.shape[0]].view(torch.uint8).numpy().data)
        per_step.append({"step": i, "tokens": ids.shape[0], "seconds": elapsed, "cpu": cpu, "read": read})
    table = getattr(module, "engram_table", None)
    tier = None if table is None or table.tier is None else dataclasses.asdict(table.tier.stats())
    print(json.dumps({"steps": per_step, "digest": digest.hexdigest(), "tier": tier}))


def run(source: Source, stream: Path, contender: str, condition: str, limit: int, ram_tier: int) -> dict:
    """One run in a fresh memory group (of `limit` bytes where limited); its report and the group's peak."""
    for path in source.directory.glob("*.safetensors"):
        if condition == "warm":  # read once from this process: its pages are charged here, not to the child
            warm_file(path)
        else:
            drop_file_cache(path)
    group = f"engram-bench-{uuid.uuid4().hex[:8]}"
    (CGROUP / group).mkdir()
    try:
        if condition == "limited":
            (CGROUP / group / "memory.limit_in_bytes").write_text(str(limit))
        command = [
            sys.executable, __file__, "--child", str(source.directory), "--table", source.name, "--stream", str(stream), "--group", group,
            "--contender", contender, "--ram-tier", str(ram_tier), *(["--cold"] if condition != "warm" else []),
        ]  # fmt: skip
        env = {"OMP_NUM_THREADS": "1", **os.environ}  # vLLM's workers' threads, unless set
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WAIT_S)
        if done.returncode != 0:
            raise SystemExit(f"{contender} ({condition}) failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        report = json.loads(done.stdout.splitlines()[-1])
        report["peak"] = int((CGROUP / group / "memory.max_usage_in_bytes").read_text())
        return report
    finally:
        (CGROUP / group).rmdir()


def bounds(source: Source, stream: Path, warmup: int, tier_rows: int, memory: int) -> dict[str, float]:
    """Pages a decode and a prefill step (after the warm-up) that the stream asks of the parts at the least
    (_bounds): the rows first asked for, a hindsight choice of `tier_rows` rows, and of the pages `memory`
    holds."""
    checkpoint = Checkpoint(source.directory)
    names = [f"{source.name}.shard_{k}.weight" for k in range(-(-source.rows // source.part_rows))]
    offsets = tuple(checkpoint.files[n].data_start + checkpoint.files[n].entries[n].begin for n in names)
    pages = FilePages(offsets, source.part_rows, source.spec.row_bytes)
    universe = -(-max(o + source.part_rows * source.spec.row_bytes for o in offsets) // PAGE)
    saved = torch.load(stream)
    steps = distinct([ids.numpy() for ids in torch.split(saved["ids"], saved["sizes"])])
    found = {
        "first_asked": pages_per_step(first_asked(steps, source.rows), pages),
        "hindsight_rows": pages_per_step(hindsight(steps, source.rows, tier_rows), pages),
        "hindsight_pages": pages_per_step(hindsight([pages.of(s) for s in steps], universe, memory // PAGE), None),
    }
    out = {}
    for kind, tokens in (("decode", DECODE), ("prefill", PREFILL)):
        chosen = [i for i, n in enumerate(saved["sizes"]) if i >= warmup and n == tokens]
        for bound, per_step in found.items():
            out[f"{kind}_{bound}"] = statistics.mean(per_step[i] for i in chosen) if chosen else float("nan")
    return out


def first_asked_rows(stream: Path, rows: int, warmup: int) -> dict[str, list[torch.Tensor]]:
    """The rows first asked for (_bounds.first_asked) in each decode and each prefill step after the warm-up."""
    saved = torch.load(stream)
    first = first_asked(distinct([ids.numpy() for ids in torch.split(saved["ids"], saved["sizes"])]), rows)
    return {
        kind: [torch.from_numpy(first[i]) for i, n in enumerate(saved["sizes"]) if i >= warmup and n == tokens]
        for kind, tokens in (("decode", DECODE), ("prefill", PREFILL))
    }


class ColdReads:
    """Rows of the table read from the disk by the RAM tier's own reader (read_direct), in this process."""

    def __init__(self, source: Source) -> None:
        fmt = ShardFormat(source.rows, source.spec.head_dim, source.dtype)
        self.table = open_table(
            source.name, fmt, "file", checkpoint=Checkpoint(source.directory), table_rows=source.rows
        )
        if not direct_reads_work(self.table.shard):
            raise SystemExit("the floor is read past the page cache (io_uring, O_DIRECT); this machine refuses it")

    def read(self, rows: torch.Tensor) -> dict[str, float]:
        """`rows` (ascending, distinct) read from the disk past the page cache: its ms and pages."""
        shard = self.table.shard
        into = torch.empty((rows.numel(), *shard.weight.shape[1:]), dtype=shard.weight.dtype)
        start = time.perf_counter()
        asked = read_direct(shard, shard.weight, rows, torch.arange(rows.numel()), into)
        return {"ms": 1e3 * (time.perf_counter() - start), "pages": asked.bytes / PAGE}

    def close(self) -> None:
        self.table.release()


def summary(report: dict, warmup: int) -> dict[str, float]:
    """Medians per decode step and per prefill step, after the warm-up."""
    out: dict[str, float] = {}
    for kind, tokens in (("decode", DECODE), ("prefill", PREFILL)):
        steps = [s for s in report["steps"][warmup:] if s["tokens"] == tokens]
        if steps:
            out[f"{kind}_ms"] = 1e3 * statistics.median(s["seconds"] for s in steps)
            out[f"{kind}_cpu_ms"] = 1e3 * statistics.median(s["cpu"] for s in steps)
            out[f"{kind}_pages"] = statistics.mean(s["read"] for s in steps) / PAGE
    return out


def tier_figures(
    results: dict[str, dict[str, list[dict]]], floor: dict[str, list[dict[str, float]]], columns: int
) -> dict[str, float]:
    """What the RAM tier costs and where it stands, printed, from the runs side by side: per condition its
    host time against the same table without it (engram), run by run, and its own CPU per id served (the
    step's CPU with it less without it, medians, over the step's ids); under the limit, its host time
    against its floor, run by run: the rows first asked for read from the disk past the page cache (the
    median step's, `floor`) plus the tier's own step's CPU (its thread's, all of it)."""
    out: dict[str, float] = {}
    print("the RAM tier against the same table without it, run by run (host time), and its own CPU per id served:")
    for condition in CONDITIONS:
        tiered, plain = (
            [r["summary"] for r in results[contender][condition]] for contender in ("engram+ram", "engram")
        )
        for kind, tokens in (("decode", DECODE), ("prefill", PREFILL)):
            ratios = [t[f"{kind}_ms"] / p[f"{kind}_ms"] for t, p in zip(tiered, plain, strict=True)]
            own = statistics.median(t[f"{kind}_cpu_ms"] for t in tiered) - statistics.median(
                p[f"{kind}_cpu_ms"] for p in plain
            )
            per_id = 1e6 * own / (tokens * columns)
            out |= {f"{condition}_{kind}_tier_x_plain": max(ratios), f"{condition}_{kind}_tier_cpu_ns_per_id": per_id}
            print(
                f"  {condition} {kind}: {' '.join(f'{r:.2f}x' for r in ratios)}; "
                f"its own CPU {per_id:,.0f} ns per id ({tokens:,} x {columns} ids a step)"
            )
    print(
        "the RAM tier under the limit against its floor (the rows first asked for, read from the disk, plus its CPU):"
    )
    for kind in ("decode", "prefill"):
        if not floor[kind]:
            continue
        disk_ms = statistics.median(f["ms"] for f in floor[kind])
        runs = [r["summary"] for r in results["engram+ram"]["limited"]]
        ratios = [r[f"{kind}_ms"] / (disk_ms + r[f"{kind}_cpu_ms"]) for r in runs]
        out[f"limited_{kind}_tier_x_floor"] = max(ratios)
        host = ", ".join(f"{r[f'{kind}_ms']:.1f}" for r in runs)
        cpu = ", ".join(f"{r[f'{kind}_cpu_ms']:.1f}" for r in runs)
        shown = " ".join(f"{x:.2f}x" for x in ratios)
        print(f"  {kind}: {shown} (host {host} ms; the disk {disk_ms:.1f} ms + its CPU {cpu} ms)")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=1.0)
    parser.add_argument("--parts", type=int, default=8, help="shard_<k> parts the table is written as")
    parser.add_argument("--checkpoint", help="a Qwen4Exp checkpoint of your own, its PLE tables in shard_<k> parts")
    parser.add_argument("--table", help="with --checkpoint: which PLE table (default: the first in parts)")
    parser.add_argument("--text", help="with --checkpoint: the text to serve (default: the corpus's held-out part)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--prefill-every", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=400, help="steps before the steady state: a tier fills")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tier-share", type=float, default=0.9, help="of the rows' memory, to the RAM tier")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--stream", help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--ram-tier", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if bool(args.checkpoint) != bool(args.text):
        parser.error("--checkpoint and --text go together")
    if not (CGROUP / "memory.limit_in_bytes").exists() or os.geteuid() != 0:
        raise SystemExit(f"needs root and a cgroup v1 memory controller at {CGROUP}")
    with scratch_dir() as scratch:
        if args.checkpoint:
            source = source_of(Path(args.checkpoint).resolve(), args.table)
            tokens = torch.tensor(deepseek_v4_tokenizer().encode(Path(args.text).read_text()).ids, dtype=torch.int64)
        else:
            write_checkpoint(scaled_qwen(args.table_gb), scratch, dtype="bf16", split_parts=args.parts)
            source = source_of(scratch, None)
            tokens = load_corpus().held_out
        stream = scratch / "stream.ids"
        save_stream(stream, source, tokens, args.steps, args.prefill_every)
        saved = torch.load(stream)
        expected = oracle_digest(source, list(torch.split(saved["ids"], saved["sizes"])))
        table_bytes = source.rows * source.spec.row_bytes
        results: dict[str, dict[str, list[dict]]] = {c: {k: [] for k in CONDITIONS} for c in CONTENDERS}
        limit, ram_tier = 0, int(args.tier_share * table_bytes / 4)
        firsts, cold_reads = first_asked_rows(stream, source.rows, args.warmup), None
        floor: dict[str, list[dict[str, float]]] = {kind: [] for kind in firsts}
        for condition in CONDITIONS:
            if condition == "limited":  # what serving needs (the warm runs' peaks, no tier) plus a quarter of the table
                limit = max(r["peak"] for c in ("vllm", "engram") for r in results[c]["warm"]) + table_bytes // 4
            for _ in range(args.repeat):
                for contender in CONTENDERS:
                    tier = ram_tier if contender == "engram+ram" else 0
                    report = run(source, stream, contender, condition, limit, tier)
                    if report["digest"] != expected:
                        raise SystemExit(f"{contender} ({condition}) staged other bytes than safetensors' reader")
                    report["summary"] = summary(report, args.warmup)
                    results[contender][condition].append(report)
                if condition == "limited":  # the disk now, between the runs it serves
                    cold_reads = cold_reads or ColdReads(source)
                    for kind, asked in firsts.items():
                        floor[kind] += [cold_reads.read(rows) for rows in asked if rows.numel()]
        if cold_reads is not None:
            cold_reads.close()
        tier_rows = max(r["tier"]["capacity_rows"] for r in results["engram+ram"]["limited"])
        page_memory = limit - min(r["peak"] for r in results["vllm"]["warm"])  # what vLLM's page cache could hold
        least = bounds(source, stream, args.warmup, tier_rows, page_memory)
    rows = []
    for condition in CONDITIONS:
        theirs = [r["summary"] for r in results["vllm"][condition]]
        for contender in CONTENDERS:
            mine = [r["summary"] for r in results[contender][condition]]
            for kind in ("decode", "prefill"):
                ratio = [m[f"{kind}_ms"] / t[f"{kind}_ms"] for m, t in zip(mine, theirs, strict=True)]
                pages = [
                    m[f"{kind}_pages"] / t[f"{kind}_pages"] if t[f"{kind}_pages"] else float("nan")
                    for m, t in zip(mine, theirs, strict=True)
                ]
                rows.append([
                    condition, contender, kind,
                    "/".join(f"{m[f'{kind}_ms']:.1f}" for m in mine), "/".join(f"{m[f'{kind}_cpu_ms']:.1f}" for m in mine),
                    "/".join(f"{x:.2f}" for x in ratio), "/".join(f"{m[f'{kind}_pages']:.0f}" for m in mine),
                    "/".join(f"{x:.2f}" for x in pages),
                ])  # fmt: skip
    print(
        f"{source.name}: {source.dtype}, {table_bytes / 2**30:.2f} GiB in {-(-source.rows // source.part_rows)} parts; limit {limit / 2**20:.0f} MiB; RAM tier {ram_tier / 2**20:.0f} MiB; rows equal safetensors' reader in every run"
    )
    print_table(["condition", "contender", "step", "host ms", "cpu ms", "x vLLM", "pages read", "x vLLM"], rows)
    theirs = {
        k: statistics.median(r["summary"][f"{k}_pages"] for r in results["vllm"]["limited"])
        for k in ("decode", "prefill")
    }
    vllm_ms = statistics.median(r["summary"]["decode_ms"] for r in results["vllm"]["limited"])
    print("what the stream allows after the warm-up, in pages a step against vLLM's under the limit (its median):")
    for kind in ("decode", "prefill"):
        first, rows_hs, pages_hs = (least[f"{kind}_{b}"] for b in ("first_asked", "hindsight_rows", "hindsight_pages"))
        print(
            f"  {kind}: the rows first asked for lie in {first:,.0f} ({first / theirs[kind]:.2f}x: every cache of rows "
            f"reads them); a hindsight choice of the tier's {tier_rows:,} rows reads {rows_hs:,.0f} ({rows_hs / theirs[kind]:.2f}x), "
            f"of pages in the {page_memory / 2**20:.0f} MiB the limit left vLLM {pages_hs:,.0f} ({pages_hs / theirs[kind]:.2f}x)"
        )
    floor_ms = statistics.median(f["ms"] for f in floor["decode"])
    quartiles = statistics.quantiles([f["ms"] for f in floor["decode"]], n=4)
    print(
        f"  each decode step's rows first asked for, read from this disk past the page cache between the limited "
        f"runs ({len(floor['decode'])} reads, median {statistics.median(f['pages'] for f in floor['decode']):.0f} pages): median "
        f"{floor_ms:.1f} ms (quartiles {quartiles[0]:.1f}-{quartiles[2]:.1f}), {floor_ms / vllm_ms:.2f}x vLLM's step "
        "under the limit: the least a cache of rows waits"
    )
    least |= {"decode_first_asked_cold_ms": floor_ms}
    least |= tier_figures(results, floor, source.spec.layout.columns)
    if args.json:
        print(
            json.dumps(
                {
                    c: {k: [r["summary"] | {"tier": r["tier"], "peak": r["peak"]} for r in v] for k, v in conds.items()}
                    for c, conds in results.items()
                }
                | {"bounds": least | {"tier_rows": tier_rows, "page_memory": page_memory}},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
