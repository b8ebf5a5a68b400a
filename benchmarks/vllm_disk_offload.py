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
quarter of the table: the same memory for every contender). Measured per step after --warmup steps: the
host time of the staging call (wall clock: the disk's waits included), its thread's CPU time, and the
bytes the process read from storage (/proc/self/io). Every run's staged bytes are checked against
safetensors' own reader of the parts, step by step (a digest). Runs alternate contenders, --repeat
times each; the figures are medians over steps, and the spread is over repeats.

Run as root on a machine with a writable cgroup v1 memory controller, by the vLLM 0.34 venv's Python:
  .venv-vllm-0.34.0/bin/python benchmarks/vllm_disk_offload.py [--table-gb N] [--steps N] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import torch
from _scratch import scratch_dir
from _timing import print_table

from engram.apps.corpus import load_corpus
from engram.apps.presets import get_preset
from engram.memory.mapping import PAGE
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.residency import drop_file_cache, storage_read_bytes

CGROUP = Path("/sys/fs/cgroup/memory")
DECODE, PREFILL = 256, 8192
CONTENDERS = ("vllm", "engram", "engram+ram")
CONDITIONS = ("warm", "cold", "limited")
WAIT_S = 1800  # for one run


def qwen_spec(table_gb: float) -> ModelSpec:
    """The Qwen4Exp PLE preset, its n-gram vocabulary scaled so its one table holds about `table_gb` GiB."""
    base = get_preset("qwen4-exp-ple")
    config = dict(base.hf_text_config)
    config["ngram_vocab_size_base"] = max(
        1024, round(config["ngram_vocab_size_base"] * table_gb * 2**30 / base.table_bytes)
    )
    return dataclasses.replace(base, name=f"qwen4-exp-ple@{table_gb}GiB", hf_text_config=config)


def save_stream(directory: Path, spec: ModelSpec, steps: int, prefill_every: int) -> None:
    """Each step's ids [tokens, heads] of the table, in order, into `directory`/stream.ids."""
    sizes = [PREFILL if prefill_every and i % prefill_every == prefill_every - 1 else DECODE for i in range(steps)]
    tokens = load_corpus().held_out[: sum(sizes)]
    ids = spec.hasher().hash(spec.compress(tokens))[:, 0].contiguous()  # the one PLE layer's columns
    torch.save({"ids": ids, "sizes": sizes}, directory / "stream.ids")


def parts_of(directory: Path, name: str) -> list[torch.Tensor]:
    """The table's `shard_<k>` parts as safetensors' own reader maps them (uint8 rows); each maps the file
    while it lives."""
    from safetensors import safe_open

    handle = safe_open(str(directory / "model.safetensors"), framework="pt")
    keys = sorted((k for k in handle.keys() if k.startswith(f"{name}.shard_")), key=lambda k: int(k.split(".")[-2][6:]))  # noqa: SIM118
    return [handle.get_tensor(k).view(torch.uint8) for k in keys]


def oracle_digest(directory: Path, name: str, steps: list[torch.Tensor]) -> str:
    """The digest of every step's rows as safetensors' reader gives them: [tokens, heads, row bytes]. Its
    copy of the table and its mappings go when it returns, so that a cold run's pages can be dropped."""
    table = torch.cat(parts_of(directory, name))
    digest = hashlib.sha256()
    for ids in steps:
        digest.update(table[ids.reshape(-1)].numpy().data)
    return digest.hexdigest()


def staging(module: torch.nn.Module, spec: ModelSpec, tokens: int, row_bytes: int) -> None:
    """The host buffers vLLM's constructor makes for the table (pinned and device ones on a GPU)."""
    heads = spec.layout.columns
    module._host_ids = torch.empty((tokens, heads), dtype=torch.long)
    shape = (tokens, heads, row_bytes // 2)
    host = torch.empty(shape, dtype=torch.bfloat16)
    module._planes = {
        "weight": (
            torch.zeros(shape, dtype=torch.bfloat16),
            host,
            torch.empty_like(host).view(torch.uint8).flatten(0, 1),
        )
    }


def vllm_module(directory: Path, spec: ModelSpec, name: str, parts: int, tokens: int) -> torch.nn.Module:
    """vLLM 0.34's disk-offload table, bound to the checkpoint's parts by its own bind_file_shards."""
    from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpPLEDiskOffloadEmbedding

    rows = spec.layout.table_rows[0]
    module = Qwen4ExpPLEDiskOffloadEmbedding.__new__(Qwen4ExpPLEDiskOffloadEmbedding)
    torch.nn.Module.__init__(module)
    staging(module, spec, tokens, spec.row_bytes)
    module.org_vocab_size, module._shard_size = rows, math.ceil(rows / parts)
    module._bound, module._dummy, module._fds, module._sources = False, False, {}, {}
    module._shards = {"weight": dict(enumerate(parts_of(directory, name)))}
    module.bind_file_shards()
    return module


def engram_module(directory: Path, spec: ModelSpec, name: str, tokens: int, ram_tier: int) -> torch.nn.Module:
    """engram's plugin class for the same table (what vLLM runs with engram enabled), its file-backed table
    opened over the same parts, with a RAM tier of `ram_tier` bytes if not 0."""
    from engram.config import load_config
    from engram.integrations.vllm.qwen_disk import EngramQwenDiskOffloadEmbedding
    from engram.runtime.table import Checkpoint, ShardFormat, open_table

    rows = spec.layout.table_rows[0]
    module = EngramQwenDiskOffloadEmbedding.__new__(EngramQwenDiskOffloadEmbedding)
    torch.nn.Module.__init__(module)
    staging(module, spec, tokens, spec.row_bytes)
    module.prefix = name
    module._engram = load_config({"cpu_offload": True, "file_backed": True, "ram_cache_bytes": ram_tier}, env={})
    table = open_table(
        name, ShardFormat(rows, spec.head_dim, "bf16"), "file", checkpoint=Checkpoint(directory), table_rows=rows
    )
    if ram_tier:
        table.keep_hot(ram_tier, "cpu", "ram")
    module.engram_table = table
    return module


def child(args: argparse.Namespace) -> None:
    """One run (module docstring): the table is opened first and the process joins its group after, so
    that what the group is charged is serving's memory, not the set-up's."""
    directory = Path(args.child)
    saved = torch.load(directory / "stream.ids")
    steps = list(torch.split(saved["ids"], saved["sizes"]))
    spec, name = qwen_spec(args.table_gb), qwen_spec(args.table_gb).table_names()[0]
    tokens = max(saved["sizes"])
    if args.contender == "vllm":
        module = vllm_module(directory, spec, name, args.parts, tokens)
    else:
        module = engram_module(directory, spec, name, tokens, args.ram_tier)
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


def run(args: argparse.Namespace, directory: Path, contender: str, condition: str, limit: int, ram_tier: int) -> dict:
    """One run in a fresh memory group (of `limit` bytes where limited); its report and the group's peak."""
    if condition != "warm":
        drop_file_cache(directory / "model.safetensors")  # pages are charged to whoever read them first
    group = f"engram-bench-{uuid.uuid4().hex[:8]}"
    (CGROUP / group).mkdir()
    try:
        if condition == "limited":
            (CGROUP / group / "memory.limit_in_bytes").write_text(str(limit))
        command = [
            sys.executable, __file__, "--child", str(directory), "--group", group, "--contender", contender,
            "--table-gb", str(args.table_gb), "--parts", str(args.parts), "--ram-tier", str(ram_tier),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gb", type=float, default=1.0)
    parser.add_argument("--parts", type=int, default=8, help="shard_<k> parts the table is written as")
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--prefill-every", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--tier-share", type=float, default=0.9, help="of the rows' memory, to the RAM tier")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--ram-tier", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not (CGROUP / "memory.limit_in_bytes").exists() or os.geteuid() != 0:
        raise SystemExit(f"needs root and a cgroup v1 memory controller at {CGROUP}")
    spec = qwen_spec(args.table_gb)
    name = spec.table_names()[0]
    with scratch_dir() as directory:
        write_checkpoint(spec, directory, dtype="bf16", split_parts=args.parts)
        save_stream(directory, spec, args.steps, args.prefill_every)
        saved = torch.load(directory / "stream.ids")
        expected = oracle_digest(directory, name, list(torch.split(saved["ids"], saved["sizes"])))
        table_bytes = spec.layout.table_rows[0] * spec.row_bytes
        results: dict[str, dict[str, list[dict]]] = {c: {k: [] for k in CONDITIONS} for c in CONTENDERS}
        limit, ram_tier = 0, int(args.tier_share * table_bytes / 4)
        for condition in CONDITIONS:
            if condition == "limited":  # what serving needs (the warm runs' peaks, no tier) plus a quarter of the table
                limit = max(r["peak"] for c in ("vllm", "engram") for r in results[c]["warm"]) + table_bytes // 4
            for _ in range(args.repeat):
                for contender in CONTENDERS:
                    report = run(
                        args, directory, contender, condition, limit, ram_tier if contender == "engram+ram" else 0
                    )
                    if report["digest"] != expected:
                        raise SystemExit(f"{contender} ({condition}) staged other bytes than safetensors' reader")
                    report["summary"] = summary(report, args.warmup)
                    results[contender][condition].append(report)
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
        f"table {table_bytes / 2**30:.2f} GiB in {args.parts} parts; limit {limit / 2**20:.0f} MiB; RAM tier {ram_tier / 2**20:.0f} MiB; rows equal safetensors' reader in every run"
    )
    print_table(["condition", "contender", "step", "host ms", "cpu ms", "x vLLM", "pages read", "x vLLM"], rows)
    if args.json:
        print(
            json.dumps(
                {
                    c: {k: [r["summary"] | {"tier": r["tier"], "peak": r["peak"]} for r in v] for k, v in conds.items()}
                    for c, conds in results.items()
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
