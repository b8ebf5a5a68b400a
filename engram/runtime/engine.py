"""One rank's Engram tables, ready for lookups: the plan, the gloo groups, the loaded shards and an
EngramEmbedding per layer. `EngramTables.build` is collective: every rank of the job calls it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from engram.config import EngramConfig, ParallelConfig
from engram.errors import EngramError
from engram.memory.host import HostLimits, check_pinned_bytes
from engram.memory.registration import CudaRuntime
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.dist import Group, new_group, timeout_s
from engram.runtime.embedding import EngramEmbedding, gather_replica_ids
from engram.runtime.plan import DeploymentPlan, RankPlan, plan_deployment
from engram.runtime.replica_nodes import align_to_nodes
from engram.runtime.shard import TableShard
from engram.runtime.table import Part, Table, TableStats
from engram.runtime.table_opener import TableOpener, lookup_device

log = logging.getLogger("engram")


@dataclass(frozen=True)
class RankGroups:
    embedding: Group | None
    dp: Group | None
    shm: Group | None


def create_groups(plan: DeploymentPlan, rank: int) -> RankGroups:
    """Every distinct group of the plan, created in one order on every rank (torch.distributed needs all
    processes to take part in every new_group); returns this rank's."""
    mine = plan.ranks[rank]

    def members(kind: str, r: RankPlan) -> Sequence[int]:
        if kind == "embedding":
            return r.embedding_group
        if kind == "dp":
            return r.dp_group if plan.across_dp else ()
        return r.shm_group or ()

    found: dict[str, Group | None] = {}
    for kind in ("embedding", "dp", "shm"):
        found[kind] = None
        for ranks in sorted({tuple(sorted(members(kind, r))) for r in plan.ranks if len(members(kind, r)) > 1}):
            group = new_group(list(ranks), f"engram {kind} group {list(ranks)}")
            if tuple(sorted(members(kind, mine))) == ranks:
                found[kind] = group
    return RankGroups(found["embedding"], found["dp"], found["shm"])


@dataclass(eq=False)
class Prefetched:
    """Lookups started by EngramTables.prefetch: per layer its rows and the event that marks them done."""

    outputs: list[torch.Tensor]
    events: list[torch.cuda.Event | None]
    later: Iterator[torch.Tensor] | None = None  # on the CPU: the lookups not run yet, in layer order

    def take(self, layer: int) -> torch.Tensor:
        """Layer `layer`'s rows [T, C, D], safe to read on the current stream (on the CPU its lookup, and
        those of the layers before it not taken yet, run now)."""
        while self.later is not None and len(self.outputs) <= layer:
            rows = next(self.later, None)
            if rows is None:
                raise IndexError(f"layer {layer} of {len(self.outputs)}")
            self.outputs.append(rows)
            self.events.append(None)
        rows, event = self.outputs[layer], self.events[layer]
        if event is not None:
            stream = torch.cuda.current_stream(rows.device)
            stream.wait_event(event)
            rows.record_stream(stream)  # allocated on the side stream, read here
        return rows


def prefetch_on(side: torch.cuda.Stream, lookups: Callable[[], Iterable[torch.Tensor]], sm_share: float) -> Prefetched:
    """Run `lookups()` (one output per layer) on the `side` stream, after what the current stream has
    queued so far, at most `sm_share` of the SMs wide, with an event behind each layer's output."""
    from engram.ops.cuda import limit_blocks

    side.wait_stream(torch.cuda.current_stream(side.device))  # the ids were written on the main stream
    blocks = max(1, round(sm_share * torch.cuda.get_device_properties(side.device).multi_processor_count))
    outputs: list[torch.Tensor] = []
    events: list[torch.cuda.Event | None] = []
    with torch.cuda.stream(side), limit_blocks(blocks):
        for output in lookups():
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(side)
            outputs.append(output)
            events.append(event)
    return Prefetched(outputs, events)


@dataclass(eq=False)
class EngramTables:
    plan: DeploymentPlan
    rank_plan: RankPlan
    groups: RankGroups
    shards: list[TableShard]
    layers: list[EngramEmbedding]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))  # where lookups run
    _pending: torch.cuda.Event | None = None  # behind the last eager step's GPU lookups
    _side: torch.cuda.Stream | None = None  # prefetch's stream

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        config: EngramConfig,
        parallel: ParallelConfig,
        checkpoint: Checkpoint | str | os.PathLike[str],
        *,
        platform: str = "cpu",
        runtime: CudaRuntime | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
        progress: bool = True,
        host_limits: HostLimits | None = None,
        profile: str | os.PathLike[str] | Mapping[str, torch.Tensor] | None = None,
    ) -> EngramTables:
        """Find which replicas share a node (nodes.align_to_nodes), plan, check that private host tables fit
        the node (before a byte is allocated), create the groups, allocate and load this rank's shards. `host_limits` replaces this machine's RAM and
        cgroup limit in that check. With device_cache_bytes (or ram_cache_bytes), each table keeps
        its hottest rows in device memory (or RAM) as cache_admission says; `profile` (an `engram profile
        --out` file, or its hot rows per table; config.device_cache_profile when not given) is their warm
        start, and with "static" all they hold."""
        if not dist.is_initialized():
            raise EngramError(
                "torch.distributed is not initialised: call engram.runtime.engine.init_from_env() or init_process_group first"
            )
        resolved = config.dp_shared_memory is None
        config = config.resolve_dp_shared_memory(parallel)  # a null one, as vLLM 0.33 resolves it
        # the replicas per node as the job really runs, and (for a resolved null) whether the node holds them
        config, parallel = align_to_nodes(
            config, parallel, resolved=resolved, table_bytes=spec.table_bytes, limits=host_limits
        )
        plan = plan_deployment(spec, config, parallel, platform)
        if plan.sharing_note and dist.get_rank() == 0:
            log.warning("engram: %s", plan.sharing_note)
        check_pinned_bytes(plan.pinned_bytes_per_node(), host_limits)  # the plan's exact bytes, any layout
        if dist.get_world_size() != len(plan.ranks):
            raise EngramError(
                f"the job has {dist.get_world_size()} processes but TP {parallel.tensor_parallel_size} x DP {parallel.data_parallel_size} needs {len(plan.ranks)}"
            )
        rank = dist.get_rank()
        mine = plan.ranks[rank]
        # the config's decisions for the tables (device, UVA runtime, budgets, tiers' profile), before a byte is loaded
        opener = TableOpener(
            config, device=lookup_device(platform), checkpoint=checkpoint, profile=profile, runtime=runtime,
            out_dtype=out_dtype,
        )  # fmt: skip
        groups = create_groups(plan, rank)
        tables = opener.tables(spec, mine.placement, mine.tables, group=groups.shm, progress=progress)
        opener.give_tiers(tables)
        layers = [
            EngramEmbedding(
                tables[table],
                mine.tables[table],
                columns=spec.layout.columns,
                group=groups.embedding,
                shard_order=mine.embedding_group,
                dp_group=groups.dp,
            )
            for table in spec.layout.table_of_layer
        ]
        for layer in layers:  # engines that load checkpoints themselves call param.weight_loader(param, tensor)
            parts: tuple[tuple[Part, nn.Parameter | None], ...] = (
                ("weight", layer.weight), ("scale", layer.scale), ("table_scale", layer.table_scale),
            )  # fmt: skip
            for part, param in parts:
                if param is not None:
                    param.weight_loader = layer.table.weight_loader(part)  # type: ignore[attr-defined]
        return cls(plan, mine, groups, [t.shard for t in tables], layers, opener.device)

    @property
    def tables(self) -> list[Table]:
        """The rank's tables, each once (layers may share one)."""
        return list({id(layer.table): layer.table for layer in self.layers}.values())

    def stats(self) -> list[TableStats]:
        """Each of the rank's tables: what it is (placement, rows, bytes) and what its lookups did."""
        return [table.stats() for table in self.tables]

    def refresh(self) -> int:
        """Refresh the tables' tiers of hot rows from the ids served since their last refresh, between
        steps (lookup does it by itself once a window of ids has been served; an engine that replays CUDA
        graphs, whose lookups the host does not see, calls it every few steps); the rows admitted."""
        if self.device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():
                return 0
            if self._side is not None:  # a prefetch in flight still reads the slots a refresh rewrites
                torch.cuda.current_stream(self.device).wait_stream(self._side)
        return sum(t.refresh() for t in self.tables)

    def lookup(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """rows: [T, layers, C] from NgramHasher -> per layer [T, C, D]. With embedding_across_dp the
        replicas' ids are gathered once per step, for all layers together.

        On a GPU nothing here synchronises: an id outside its table reads zeros and is reported by the
        next lookup (or check_errors), on every rank of the group alike, since they all hold the same ids."""
        out = list(self._lookups(rows))
        if rows.is_cuda and not torch.cuda.is_current_stream_capturing():
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record()
            self._pending = done
        return out

    def _lookups(self, rows: torch.Tensor) -> Iterator[torch.Tensor]:
        """Each layer's lookup, run as the caller asks for the next (prefetch records an event between, or
        on the CPU leaves each to its take); the step's checks and ids (_step_ids) now."""
        return self._layer_lookups(*self._step_ids(rows))

    def _layer_lookups(self, ids: torch.Tensor, mine: slice | None) -> Iterator[torch.Tensor]:
        """Each layer's lookup of the step's ids (_step_ids), as the caller asks for the next."""
        if mine is None:
            return (layer(ids[:, i]) for i, layer in enumerate(self.layers))
        return (layer.lookup_gathered(ids[:, i])[mine] for i, layer in enumerate(self.layers))

    def _step_ids(self, rows: torch.Tensor) -> tuple[torch.Tensor, slice | None]:
        """The ids this rank's tables serve this step, [tokens, layers, columns], after the checks and a
        due refresh: `rows`, or with embedding_across_dp every replica's, gathered once for all layers, and
        the slice of them that is this rank's."""
        self.check_errors()
        if any(t.tier is not None and t.tier.due for t in self.tables):
            self.refresh()  # between steps, before this step's lookups (Table.lookup would, but not waiting for prefetch)
        expected = (len(self.layers), self.layers[0].columns) if self.layers else ()
        if rows.dim() != 3 or tuple(rows.shape[1:]) != expected:
            raise EngramError(
                f"rows must be [tokens, {', '.join(map(str, expected))}] (tokens, layers, columns); got {list(rows.shape)}"
            )
        if self.groups.dp is None or self.groups.dp.size == 1:
            return rows, None
        tokens, layers, columns = rows.shape
        everyone, start = gather_replica_ids(rows.reshape(tokens, layers * columns).to(torch.int64), self.groups.dp)
        return everyone.view(-1, layers, columns), slice(start, start + tokens)

    def prefetch(self, rows: torch.Tensor, *, sm_share: float = 0.25) -> Prefetched:
        """Start every layer's lookup now (row ids depend only on the tokens, so all are known when the
        step starts) and return a handle; `take(layer)` hands each layer its rows. On a GPU the lookups
        run on a side stream, at most `sm_share` of the SMs wide (in thread blocks), so the model's compute
        keeps the rest; the layer's stream waits on that layer's event only. The cap holds engram's gather
        kernels only: the sort of the sorted form and the device cache's search and merge are torch ops,
        which take what grid they take (short next to the gathers). Capturable in a CUDA graph (the side
        stream forks from and joins the capturing stream). On the CPU every layer's file-backed table starts
        reading the rows it lacks now (Table.prefetch: into its RAM tier, or the page cache), so that the
        reads of all layers are in flight together while the model works, and each layer's lookup runs
        when the layer takes its rows (in layer order)."""
        if not 0 < sm_share <= 1:
            raise EngramError(f"sm_share must be in (0, 1], got {sm_share}")
        if not rows.is_cuda:
            ids, mine = self._step_ids(rows)
            for i, layer in enumerate(self.layers):
                layer.table.prefetch(ids[:, i])
            return Prefetched([], [], self._layer_lookups(ids, mine))
        if self._side is None:
            self._side = torch.cuda.Stream(rows.device)  # type: ignore[no-untyped-call]
        handle = prefetch_on(self._side, lambda: self._lookups(rows), sm_share)
        rows.record_stream(self._side)  # the caller may free rows before the side stream has read them
        return handle

    def check_errors(self) -> None:
        """Raise if a lookup since the last check was given a row id outside its table (on a GPU the kernels
        only flag it): eager lookups, prefetches, graph replays and direct EngramEmbedding calls alike. Waits
        for the last eager step's lookups first, which have normally finished by the next step (the engine
        synchronised to sample), so this costs no sync in the steady state; while a stream captures it
        waits for nothing and reads the flags as they stand."""
        if self.device.type != "cuda":
            return
        from engram.ops.cuda import check_error_flags

        if torch.cuda.is_current_stream_capturing():
            check_error_flags()  # no waiting while capturing: the eager step's wait stays owed
            return
        pending, self._pending = self._pending, None
        check_error_flags(after=pending)

    def release(self) -> None:
        """Free the tables. On a GPU, waits for the work queued so far (a prefetch in flight reads them);
        a CUDA graph captured over these tables must not be replayed after this."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.layers.clear()
        for shard in self.shards:
            shard.release()


def init_from_env(backend: str = "gloo") -> int:
    """Join the job torchrun (or any launcher setting RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) started.
    Returns this process's rank."""
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise EngramError(f"{', '.join(missing)} not set: start the processes with torchrun, or set them")
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=timeout_s()))
    return dist.get_rank()
