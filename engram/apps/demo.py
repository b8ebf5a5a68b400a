"""The demo: a synthetic fp8 checkpoint of the `demo` preset (made once, cached), data-parallel replicas on
this machine sharing one /dev/shm copy of the tables, a paragraph hashed with the real DeepSeek V4
tokenizer, lookups on every replica checked against a single-process reference, and a report.

On a GPU (`device="cuda"`) the replicas hash and look up on it with the configured placement, and can
also check a CUDA-graph replay and torch.compile of the lookup (scripts/gpu_check.py runs every placement
this way)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import torch

from engram.apps.local_ranks import run_local, values
from engram.config import Deployment, EngramConfig, ParallelConfig
from engram.errors import EngramError
from engram.memory.host import check_pinned_bytes
from engram.ngram.spec import ModelSpec
from engram.ngram.vocab import deepseek_v4_tokenizer
from engram.ops import gather_reference
from engram.runtime import dist as edist
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.engine import EngramTables
from engram.runtime.placement.storage import placement_for
from engram.runtime.plan import plan_deployment
from engram.runtime.rank_tables import tables_pss
from engram.scratch import reclaim_scratch, scratch_name
from engram.user_cache import cache_subdir

PARAGRAPH = (
    "Engram gives a language model a conditional memory: at a few layers, the last few tokens are hashed "
    "into huge tables of n-gram embeddings, and the rows found there are mixed into the hidden state. "
    "Because the row ids depend only on the token ids, every row a step needs is known before the first "
    "layer runs, so the tables can live in host memory, be read over PCIe, and be shared by every replica "
    "on the node. DeepSeek V4.1 carries two such tables of about 384 million rows each."
)
LOOKUP_REPEATS = 20
GRAPH_TOKENS = 256  # a decode step's tokens, for the CUDA-graph check
EXTRAS = ("graph", "compile")


def cached_checkpoint(spec: ModelSpec, seed: int = 0) -> Path:
    """The preset's synthetic checkpoint, written once into the cache (atomically: a half-written one is
    never picked up, and runs that write it at once all end with the first one's). Its name carries a digest of the whole spec, so a preset that changed shape gets a
    checkpoint of its own instead of the old one."""
    fields = dataclasses.asdict(spec)
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
    target = cache_subdir("checkpoints") / f"{spec.name}-{spec.dtype}-seed{seed}-{key}"
    if (target / "config.json").exists():
        return target
    reclaim_scratch(target.parent)  # what a run killed while writing left
    staging = target.parent / scratch_name(target.name)
    staging.mkdir(mode=0o700)
    try:
        write_checkpoint(spec, staging, seed=seed)
        try:
            os.rename(staging, target)
        except OSError:  # another run wrote it first (ENOTEMPTY, EEXIST): theirs is the same checkpoint
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def replica_tokens(spec: ModelSpec, dp: int) -> tuple[list[list[int]], str]:
    """Each replica's compressed ids: the paragraph, split into `dp` uneven requests."""
    if spec.tokenizer == "deepseek-v4":
        raw = deepseek_v4_tokenizer().encode(PARAGRAPH, add_special_tokens=False).ids
        ids = spec.compress(torch.tensor(raw)).tolist()
        source = f"{len(raw)} tokens of the built-in paragraph, DeepSeek V4 tokenizer"
    else:
        ids = torch.randint(0, spec.vocab, (96,), generator=torch.Generator().manual_seed(0)).tolist()
        source = f"{len(ids)} deterministic ids ({spec.name} has no bundled tokenizer)"
    cuts = [round(len(ids) * (d * d + d) / (dp * dp + dp)) for d in range(dp + 1)]  # growing chunks: uneven on purpose
    return [ids[cuts[d] : cuts[d + 1]] for d in range(dp)], source


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def replica(
    rank: int,
    world: int,
    spec: ModelSpec,
    config: EngramConfig,
    parallel: ParallelConfig,
    checkpoint: str,
    tokens: list[list[int]],
    device: str = "cpu",
    extras: tuple[str, ...] = (),
) -> dict[str, Any]:
    everyone = edist.new_group(list(range(world)), "engram demo")
    started = time.perf_counter()
    tables = EngramTables.build(spec, config, parallel, checkpoint, platform=device, progress=rank == 0)
    edist.barrier(everyone, "tables loaded")
    load_seconds = time.perf_counter() - started
    mine = tables.rank_plan
    rows = spec.hasher().hash(torch.tensor(tokens[mine.dp_rank], dtype=torch.int64, device=device))
    outputs = [o.cpu() for o in tables.lookup(rows)]
    first_lookup_seconds = time.perf_counter() - started  # start-up: build, then the first step's lookups
    checked = {extra: EXTRA_CHECKS[extra](tables, spec, device) for extra in extras}
    started = time.perf_counter()
    for _ in range(LOOKUP_REPEATS):
        tables.lookup(rows)
    if device == "cuda":
        torch.cuda.synchronize()
    lookup_seconds = time.perf_counter() - started
    edist.barrier(everyone, "lookups done")  # every page a replica will touch is mapped before anyone counts
    table_pss = tables_pss(tables.shards)
    edist.barrier(everyone, "memory measured")  # nobody unmaps before everyone has read its smaps
    return {
        "rank": rank,
        "dp_rank": mine.dp_rank,
        "tp_rank": mine.tp_rank,
        "digest": digest(outputs),
        "load_seconds": load_seconds,
        "first_lookup_seconds": first_lookup_seconds,
        "lookups_per_second": rows.numel() * LOOKUP_REPEATS / lookup_seconds
        if mine.tp_rank == 0 and rows.numel()
        else 0.0,
        "pss": table_pss,
        "tables": [dataclasses.asdict(stats) for stats in tables.stats()],
        **checked,
    }


def _new_rows(spec: ModelSpec, tokens: int, seed: int, device: str) -> torch.Tensor:
    ids = torch.randint(0, spec.vocab, (tokens,), generator=torch.Generator().manual_seed(seed))
    return spec.hasher().hash(ids.to(device))


def check_graph(tables: EngramTables, spec: ModelSpec, device: str) -> bool | str:
    """Capture one decode step's lookup (GRAPH_TOKENS tokens, every layer) in a CUDA graph, then replay it
    with new ids copied in: each replay must equal the eager lookup of those ids bit for bit. A rank
    that runs collectives (TP or embedding_across_dp over gloo) cannot be captured: says so instead."""
    if device != "cuda":
        return "needs a CUDA device"
    if any(layer.group is not None or layer.dp_group is not None for layer in tables.layers):
        return "not captured: this rank runs gloo collectives, which CUDA graphs cannot hold"
    static = _new_rows(spec, GRAPH_TOKENS, 1, device)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up outside the capture (allocator, kernel loading)
        tables.lookup(static)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tables.lookup(static)
    ok = True
    for seed in (2, 3):
        fresh = _new_rows(spec, GRAPH_TOKENS, seed, device)
        static.copy_(fresh)
        graph.replay()
        want = tables.lookup(fresh)
        ok = ok and all(torch.equal(g, w) for g, w in zip(captured, want, strict=True))
    return ok


def check_compile(tables: EngramTables, spec: ModelSpec, device: str) -> bool:
    """torch.compile(fullgraph=True) of a module that calls the first layer's embedding equals eager."""
    layer = tables.layers[0]

    class Mixer(torch.nn.Module):
        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            rows: torch.Tensor = layer(ids)
            return rows.float().sum(dim=1)

    rows = _new_rows(spec, 64, 4, device)[:, 0]
    module = Mixer()
    compiled = torch.compile(module, fullgraph=True)
    return bool(torch.equal(compiled(rows), module(rows)))


EXTRA_CHECKS = {"graph": check_graph, "compile": check_compile}


def reference_digests(spec: ModelSpec, checkpoint: Path, tokens: list[list[int]]) -> list[str]:
    """Unsharded, single-process lookups of every replica's tokens, on the CPU straight from the checkpoint."""
    files = Checkpoint(checkpoint)
    hasher = spec.hasher()
    out = []
    for ids in tokens:
        rows = hasher.hash(torch.tensor(ids, dtype=torch.int64))
        per_layer = []
        for layer, table in enumerate(spec.layout.table_of_layer):
            name, table_rows = spec.table_names()[table], spec.layout.table_rows[table]
            scale = files.sources[f"{name}.scale"]() if f"{name}.scale" in files.sources else None
            per_layer.append(
                gather_reference(
                    files.sources[f"{name}.weight"](), scale, rows[:, layer], 0, table_rows, torch.bfloat16
                )
            )
        out.append(digest(per_layer))
    return out


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def run_demo(
    spec: ModelSpec,
    deployment: Deployment,
    *,
    device: str = "cpu",
    checkpoint: Path | None = None,
    extras: tuple[str, ...] = (),
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Run the replicas on `device` ("cpu" or "cuda", every replica on the one GPU), from `checkpoint`
    (default: the preset's cached synthetic one); `extras` adds checks from EXTRAS to every replica."""
    if device not in ("cpu", "cuda"):
        raise EngramError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise EngramError("device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu")
    unknown = sorted(set(extras) - set(EXTRAS))
    if unknown:
        raise EngramError(f"unknown demo checks {unknown}; choose from {list(EXTRAS)}")
    parallel = deployment.parallel or ParallelConfig()
    config = deployment.engram
    edist.timeout_s()  # a bad ENGRAM_DIST_TIMEOUT_S fails here once, not in every replica
    plan = plan_deployment(spec, config, parallel, "cuda" if device == "cuda" else "cpu")
    check_pinned_bytes(plan.pinned_bytes_per_node())  # likewise tables that cannot fit
    world = parallel.tensor_parallel_size * parallel.data_parallel_size
    if world > 16:
        raise EngramError(f"the demo runs every rank on this machine; TP x DP = {world} is too many (at most 16)")
    checkpoint = cached_checkpoint(spec) if checkpoint is None else checkpoint
    tokens, source = replica_tokens(spec, parallel.data_parallel_size)
    # A null dp_shared_memory goes to the replicas as null: EngramTables.build resolves it there, where a
    # node that cannot hold the shared tables falls back to private copies, as vLLM does.
    given = (
        config
        if deployment.dp_shared_memory_given is not None
        else msgspec.structs.replace(config, dp_shared_memory=None)
    )
    results = values(
        run_local(world, replica, spec, given, parallel, str(checkpoint), tokens, device, extras, timeout=timeout)
    )
    expected = reference_digests(spec, checkpoint, tokens)
    match = all(r["digest"] == expected[r["dp_rank"]] for r in results)
    load_seconds = max(r["load_seconds"] for r in results)
    return {
        "preset": spec.name,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "data_parallel_size": parallel.data_parallel_size,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "placement": placement_for(config, device),
        "backend": "gloo",
        "checks": {extra: [r[extra] for r in results] for extra in extras},
        "engram": {k: getattr(config, k) for k in config.__struct_fields__},
        "tokens": [len(t) for t in tokens],
        "token_source": source,
        "table_rows": sum(spec.layout.table_rows),
        "table_bytes": spec.table_bytes,
        "host_pss_bytes": sum(r["pss"] for r in results),
        "private_estimate_bytes": spec.table_bytes * parallel.data_parallel_size,
        "load_seconds": load_seconds,
        "load_bytes_per_second": spec.table_bytes / load_seconds,
        "first_lookup_seconds": max(r["first_lookup_seconds"] for r in results),
        "lookups_per_second": sum(r["lookups_per_second"] for r in results),
        "hash": config.compute_hash(),
        "match": match,
        "tables": {str(r["rank"]): r["tables"] for r in results},  # each rank's tables: EngramTables.stats()
    }
