"""Per-rank code of the sharding tests: build the sharded tables for every valid config (every placement
the CPU platform has, both shard layouts), look up uneven, partly dead and idle batches, and compare them
bit for bit with the rows safetensors' own reader gives (tests/runtime/reference.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from engram.config import ConfigError, EngramConfig, ParallelConfig, load_config
from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.ops import DEAD_ID
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.engine import EngramTables
from engram.runtime.placement.residency import drop_file_cache
from tests.bits import same_bits
from tests.runtime.reference import expected_lookup, expected_tables
from tests.runtime.specs import SPECS

FIELDS = ("cpu_offload", "embedding_across_dp", "dp_shared_memory", "use_thp", "file_backed")


def valid_configs(parallel: ParallelConfig) -> list[EngramConfig]:
    """Every valid setting of the five fields that choose a placement and a layout, in vLLM 0.33's shard
    layout, and where DP > 1 and the tables are not shared (the layouts differ only there) in the seed's
    replica layout too."""
    out = []
    for values in itertools.product([False, True], repeat=len(FIELDS)):
        for layout in ("vllm", "replica"):
            try:
                config = load_config({**dict(zip(FIELDS, values, strict=True)), "shard_layout": layout}, env={})
                config.verify_parallel_config(parallel)
            except ConfigError:
                continue
            if layout == "vllm" or (parallel.data_parallel_size > 1 and not config.dp_shared_memory):
                out.append(config)
    return out


def batches(spec: ModelSpec, dp_rank: int, dp: int) -> Iterator[torch.Tensor]:
    """Row ids for three steps: uneven token counts across replicas, DEAD_ID entries, and a step where
    the last replica (when there are several) is idle."""
    hasher = spec.hasher("torch")
    generator = torch.Generator().manual_seed(100 + dp_rank)
    for step, count in enumerate((5 + 3 * dp_rank, 4, 6)):
        if step == 2 and dp > 1 and dp_rank == dp - 1:
            count = 0
        ids = torch.randint(0, spec.vocab, (count,), generator=generator)
        rows = hasher.hash(ids)
        dead = torch.rand(rows.shape, generator=generator) < 0.2
        yield torch.where(dead, torch.full_like(rows, DEAD_ID), rows)


def matches(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return len(got) == len(want) and all(same_bits(g, w) for g, w in zip(got, want, strict=True))


@contextlib.contextmanager
def forbid_collectives(groups: set[Any]) -> Iterator[None]:
    """Make every collective on `groups` (None: the default world group) raise."""
    names = (
        "all_gather",
        "all_reduce",
        "broadcast",
        "all_to_all",
        "reduce_scatter",
        "all_gather_into_tensor",
        "barrier",
    )
    originals = {name: getattr(dist, name) for name in names}

    def guard(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("group") in groups:
                raise RuntimeError(f"DP collective {name} called")
            return originals[name](*args, **kwargs)

        return call

    for name in names:
        setattr(dist, name, guard(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def reload_with_weight_loaders(tables: EngramTables, checkpoint: str, wipe_first: bool) -> None:
    """Load every parameter again through the weight_loader the engine attaches, as an engine that reads
    the checkpoint itself would (private tables are wiped first, so the lookups below prove the reload)."""
    files = Checkpoint(checkpoint)
    done = set()
    f = tables.shards[0].format.row_format
    for layer in tables.layers:
        parts = (("weight", layer.weight), (f.scale_name, layer.scale), (f.table_scale_name, layer.table_scale))
        for suffix, param in parts:
            name = f"{layer.plan.table}.{suffix}"
            if param is None or name in done:
                continue
            done.add(name)
            if wipe_first:
                param.data.view(torch.uint8).zero_()
            param.weight_loader(param, files.sources[name]())


def check_all(
    rank: int, world: int, tp: int, dp: int, dp_local: int, checkpoints: dict[str, str], spec_names: list[str]
) -> list[dict[str, Any]]:
    parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp, data_parallel_size_local=dp_local)
    reports = []
    for spec_name in spec_names:
        spec = SPECS[spec_name]
        tables_wanted = expected_tables(checkpoints[spec_name], spec)
        for config in valid_configs(parallel):
            plan_rank = rank % tp, rank // tp
            os.environ["ENGRAM_NODE_ID"] = f"node-{plan_rank[1] // dp_local}"  # simulated nodes share nothing
            tables = EngramTables.build(spec, config, parallel, checkpoints[spec_name], platform="cpu", progress=False)
            private = tables.rank_plan.placement not in ("shm", "file")  # wiped first: the reload must refill it
            reload_with_weight_loaders(tables, checkpoints[spec_name], wipe_first=private)
            shared = tables.groups.shm is not None
            forbidden = {tables.groups.shm.handle, None} if tables.groups.shm is not None else set()
            steps = []
            with forbid_collectives(forbidden):
                for ids in batches(spec, tables.rank_plan.dp_rank, dp):
                    steps.append(matches(tables.lookup(ids), expected_lookup(tables_wanted, spec, ids)))
                guard_works = None
                if forbidden:  # the guard itself must bite, or the check above proves nothing
                    try:
                        dist.all_reduce(torch.zeros(1), group=tables.groups.shm.handle)
                        guard_works = False
                    except RuntimeError:
                        guard_works = True
            reports.append(
                {
                    "spec": spec_name,
                    "config": {f: getattr(tables.plan.config, f) for f in (*FIELDS, "shard_layout")},
                    "match": all(steps),
                    "steps": len(steps),
                    "shared": shared,
                    "sharing_note": tables.plan.sharing_note,
                    "guard_works": guard_works,
                    "kind": tables.rank_plan.tables[0].kind,
                    "placement": tables.rank_plan.placement,
                    "rows": [(t.row_start, t.row_stop) for t in tables.rank_plan.tables],
                    "group": list(tables.rank_plan.embedding_group),
                    "shm_path": tables.shards[0].mapping.path if tables.shards[0].mapping is not None else None,
                }
            )
            tables.release()
    return reports


def build_over_limit(rank: int, world: int, checkpoint: str, layout: str) -> str:
    """Private tables that the (pretended) node of 1.5 tables' bytes cannot hold: refused before anything
    is allocated. In vLLM 0.33's layout the node holds one copy (split over its replicas) and it fits."""
    from engram.config import ParallelConfig, load_config
    from engram.memory.host import HostLimits

    spec = SPECS["ds7"]
    EngramTables.build(
        spec,
        load_config({"dp_shared_memory": False, "shard_layout": layout}, env={}),
        ParallelConfig(data_parallel_size=world),
        checkpoint,
        host_limits=HostLimits(spec.table_bytes * 3 // 2),
        progress=False,
    )
    return "built"


def bad_id_then_good(
    rank: int, world: int, tp: int, dp: int, checkpoint: str, engram: dict[str, bool]
) -> dict[str, Any]:
    """A step with an id outside its table, then a good step: every rank must raise alike in the first
    (before any collective, so no rank waits on another) and match the reference in the second."""
    spec = SPECS["ds7"]
    parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)
    tables = EngramTables.build(spec, load_config(engram, env={}), parallel, checkpoint, platform="cpu", progress=False)
    good = next(batches(spec, tables.rank_plan.dp_rank, dp))
    bad = good.clone()
    bad[0, 1, 2] = spec.layout.table_rows[1]  # layer 1 only: layer 0 runs, then the bad layer raises
    try:
        tables.lookup(bad)
        error = None
    except EngramError as exc:
        error = str(exc)
    shapes = []
    for wrong in (good[:, 0], good[:, :1], torch.cat([good, good[:, :1]], dim=1), good.reshape(-1)):
        try:
            tables.lookup(wrong)
            shapes.append("accepted")
        except EngramError as exc:
            shapes.append(str(exc))
    got = tables.lookup(good)
    prefetched = tables.prefetch(good)
    want = expected_lookup(expected_tables(checkpoint, spec), spec, good)
    report = {
        "error": error,
        "shapes": shapes,
        "good_after": matches(got, want),
        "prefetch": matches([prefetched.take(i) for i in range(len(want))], want),
    }
    tables.release()
    return report


def prefetch_into_ram_tiers(rank: int, world: int, dp: int, checkpoint: str) -> dict[str, Any]:
    """File-backed tables with RAM tiers, the files' page cache dropped: prefetch starts every layer's reads
    of the rows its tier lacks (every replica's ids, gathered) before any layer takes its rows, and the
    rows taken equal the reference's, step after step. Past the page cache (ENGRAM_DIRECT_READS=1) whatever
    memory this machine has to spare."""
    os.environ["ENGRAM_DIRECT_READS"] = "1"  # this worker's process alone
    spec = SPECS["ds7"]
    parallel = ParallelConfig(data_parallel_size=dp)
    engram = {"cpu_offload": True, "file_backed": True, "embedding_across_dp": dp > 1, "ram_cache_bytes": 1 << 20}
    tables = EngramTables.build(spec, load_config(engram, env={}), parallel, checkpoint, platform="cpu", progress=False)
    for table in tables.tables:
        for mapping in table.shard.files:
            drop_file_cache(mapping.path, file_id=mapping.file_id)
    reference = expected_tables(checkpoint, spec)
    report: dict[str, Any] = {"tiers": [type(t.tier).__name__ for t in tables.tables], "steps": []}
    for ids in batches(spec, tables.rank_plan.dp_rank, dp):
        before = [t.tier.stats().admissions for t in tables.tables if t.tier is not None]
        prefetched = tables.prefetch(ids)
        started = [t.tier.stats().admissions for t in tables.tables if t.tier is not None]
        got = [prefetched.take(i) for i in range(len(tables.layers))]
        report["steps"].append(
            {
                "admitted_before_take": [b - a for a, b in zip(before, started, strict=True)],
                "rows": matches(got, expected_lookup(reference, spec, ids)),
            }
        )
    tables.release()
    return report


def build_on_nodes(rank: int, world: int, nodes: list[str], local: int, checkpoint: str) -> dict[str, Any]:
    """dp_shared_memory with each rank claiming the node nodes[rank]: the plan follows the real nodes."""
    os.environ["ENGRAM_NODE_ID"] = nodes[rank]
    spec = SPECS["ds7"]
    parallel = ParallelConfig(data_parallel_size=world, data_parallel_size_local=local)
    tables = EngramTables.build(
        spec, load_config({"dp_shared_memory": True}, env={}), parallel, checkpoint, progress=False
    )
    ids = next(batches(spec, rank, world))
    match = matches(tables.lookup(ids), expected_lookup(expected_tables(checkpoint, spec), spec, ids))
    report = {
        "placement": tables.rank_plan.placement,
        "local": tables.plan.parallel.data_parallel_size_local,
        "shm_group": list(tables.rank_plan.shm_group or ()),
        "match": match,
    }
    tables.release()
    return report


def cached_lookup(rank: int, world: int, checkpoint: str, profile: str) -> dict[str, Any]:
    """TP 2 tables of the tiny preset with a 4 KiB device cache per rank (its profile named in the config,
    device_cache_profile), against the uncached lookup."""
    from engram.apps.presets import get_preset

    spec = get_preset("tiny")
    parallel = ParallelConfig(tensor_parallel_size=world)
    config = load_config(
        {"device_cache_bytes": 4096, "device_cache_profile": profile, "cache_admission": "static"}, env={}
    )
    cached = EngramTables.build(spec, config, parallel, checkpoint, progress=False)
    plain = EngramTables.build(spec, load_config({}, env={}), parallel, checkpoint, progress=False)
    from engram.apps.corpus import load_corpus

    tokens = load_corpus().held_out[:500]
    rows = spec.hasher().hash(spec.compress(tokens))
    got, want = cached.lookup(rows), plain.lookup(rows)
    hits = sum(
        int(torch.isin(rows[:, i], layer.table.tier.rows.ids).sum())
        for i, layer in enumerate(cached.layers)
        if layer.table.tier is not None
    )
    stats = cached.stats()
    report = {
        "match": all(torch.equal(g.view(torch.int16), w.view(torch.int16)) for g, w in zip(got, want, strict=True)),
        "cached_rows": sum(s.tier.rows for s in stats if s.tier is not None),
        "hits": hits,
        "stats": [(s.name, s.lookups, 0 if s.tier is None else s.tier.rows) for s in stats],
        "counted_hits": sum(s.tier.hits for s in stats if s.tier is not None),
        "layers_of_table": [spec.layout.table_of_layer.count(t) for t in range(len(spec.table_names()))],
        "names": spec.table_names(),
    }
    # online, no profile: the tiers fill from the traffic (a window of 131,072 ids is about 16k tokens here)
    online = EngramTables.build(
        spec, load_config({"device_cache_bytes": 8 << 20}, env={}), parallel, checkpoint, progress=False
    )
    stream = spec.hasher().hash(spec.compress(load_corpus().held_out[:40_000]))
    report["online_match"] = all(
        torch.equal(g.view(torch.int16), w.view(torch.int16))
        for step in torch.split(stream, 1000)
        for g, w in zip(online.lookup(step), plain.lookup(step), strict=True)
    )
    report["online"] = [
        s.tier and (s.tier.policy, s.tier.refreshes, s.tier.hits, s.tier.lookups, s.ids) for s in online.stats()
    ]
    online.release()
    cached.release()
    plain.release()
    return report
