"""The config's decisions for one process's tables, made here once for every user of the table layer:
engram's engine (EngramTables.build) and the engine plugins (engram.integrations.model_tables, for vLLM's
and SGLang's). A TableOpener decides the device lookups run on, the CUDA runtime that pins host tables for
the GPU's reads over UVA, the checkpoint tables are served or loaded from, the one resident-set budget
its files share (file_cache_bytes), node sharing's mode, and the tier of hot rows each table gets (which
tier, its budget split, warm from the profile); a caller adds only where a table lives (its plan, or the
engine's rule) and the rows it holds."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import torch

from engram.config import EngramConfig
from engram.memory.registration import CudaRuntime
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.dist import Group
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.placement.storage import placement_for
from engram.runtime.plan import TableShardPlan
from engram.runtime.rank_tables import open_tables
from engram.runtime.shard import Placement, ShardFormat
from engram.runtime.table import Table, open_table
from engram.runtime.tiers.assign import configured_profile, keep_hot


def lookup_device(platform: str | None = None) -> torch.device:
    """Where this process's lookups run: its current GPU on platform "cuda" (None: wherever torch sees
    one), else the CPU."""
    on_gpu = torch.cuda.is_available() if platform is None else platform == "cuda"
    return torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")


class TableOpener:
    """Opens a process's tables as `config` says (module docstring)."""

    def __init__(
        self,
        config: EngramConfig,
        *,
        device: torch.device | None = None,
        checkpoint: Checkpoint | str | os.PathLike[str] | None = None,
        profile: str | os.PathLike[str] | Mapping[str, torch.Tensor] | None = None,
        runtime: CudaRuntime | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        """`device`: where lookups run (default lookup_device()); `checkpoint`: what placements file and
        node read; `profile`: the tiers' warm start (configured_profile: config.device_cache_profile when
        not given), read now, before a byte is loaded, so a static tier without one is refused first;
        `runtime`: the CUDA runtime host tables are pinned with (default: the library's, on a GPU)."""
        self.config = config
        self.device = lookup_device() if device is None else device
        self.checkpoint = (
            checkpoint if checkpoint is None or isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
        )
        self.hot = configured_profile(config, profile)
        self.budget = ResidentBudget(config.file_cache_bytes) if config.file_cache_bytes else None
        self.out_dtype = out_dtype
        self._runtime = runtime
        if self.device.type == "cuda":
            from engram.ops.cuda import error_flag

            error_flag(self.device)  # now, not lazily inside a CUDA graph's capture

    def placement(self, *, shareable: bool = True) -> Placement:
        """Where a table of this config lives on this device (placement_for). `shareable`: the caller has a
        node-local group of replicas to share one copy in (dp_shared_memory)."""
        return placement_for(self.config, self.device.type, shareable=shareable)

    def runtime(self, placement: Placement) -> CudaRuntime | None:
        """The runtime a table at `placement` is pinned with: on a GPU, every host table's (read over UVA)."""
        if placement == "device":
            return None
        if self._runtime is None and self.device.type == "cuda":
            from engram.ops.cuda import library_runtime

            self._runtime = library_runtime()
        return self._runtime

    def table(
        self,
        name: str,
        fmt: ShardFormat,
        placement: Placement,
        *,
        row_start: int = 0,
        table_rows: int | None = None,
        group: Group | None = None,
        progress: bool = True,
    ) -> Table:
        """Rows [row_start, row_start + fmt.rows) of the table `name`: empty memory the engine's own weight
        loaders fill (Table.weight_loader), or with placement file the checkpoint's pages, with placement
        node the node's copy (attached, or loaded from the checkpoint now). `group`: placement shm's
        node-local replicas."""
        return open_table(
            name, fmt, placement, out_dtype=self.out_dtype, budget=self.budget, row_start=row_start,
            table_rows=table_rows, checkpoint=self.checkpoint, group=group, runtime=self.runtime(placement),
            sharing=self.config.node_sharing, node_dir=self.config.node_dir, device=self.device, progress=progress,
        )  # fmt: skip

    def tables(
        self,
        spec: ModelSpec,
        placement: Placement,
        plans: Sequence[TableShardPlan],
        *,
        group: Group | None = None,
        progress: bool = True,
        on_bytes: Callable[[int], None] | None = None,
    ) -> list[Table]:
        """The planned shards of `spec`'s tables, loaded from the checkpoint (open_tables)."""
        if self.checkpoint is None:
            raise ValueError("TableOpener.tables loads from a checkpoint: open the TableOpener with one")
        shards = open_tables(
            spec, self.checkpoint, placement, plans=plans, group=group, runtime=self.runtime(placement),
            progress=progress, on_bytes=on_bytes, sharing=self.config.node_sharing, node_dir=self.config.node_dir,
            device=self.device,
        )  # fmt: skip
        return [
            Table(shard, p.table_rows, out_dtype=self.out_dtype, budget=self.budget, group=group)
            for shard, p in zip(shards, plans, strict=True)
        ]

    def give_tiers(
        self, tables: Sequence[Table], *, among: int | None = None, key: Callable[[str], str] | None = None
    ) -> None:
        """Each of `tables` its tier of hot rows where one is configured (keep_hot), warm from the profile.
        Each budget is split over these tables, or over `among` where an engine gives the rank's tables one
        at a time (its count of them; a profile's own count wins). `key`: the profile's name for a table's."""
        if not (self.config.device_cache_bytes or self.config.ram_cache_bytes):
            return
        if among is not None and self.hot is not None:
            among = len(self.hot)
        keep_hot(self.config, tables, self.device, self.hot, among=among, profile_key=key)
