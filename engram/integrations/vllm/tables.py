"""The engram table behind one of vLLM's table modules: where it lives (the engine's rule), the checkpoint
it is served or loaded from, the tier of hot rows it gets on its first lookup, and its lookups, whose
counters reach vLLM's /metrics. Everything below is the table layer's (engram.runtime.table)."""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm import files
from engram.integrations.vllm.metrics import METRICS
from engram.runtime.table import (
    Group,
    Output,
    Placement,
    ShardFormat,
    Table,
    configured_profile,
    keep_hot,
    open_table,
    placement_for,
    uva_runtime,
)

log = logging.getLogger("engram")


def placement(config: EngramConfig, family: str) -> Placement | None:
    """Where engram keeps a table of `family` ("deepseek" or "qwen") inside vLLM: the engine's rule
    (placement_for), or None where vLLM's layout leaves the table to vLLM: a device table on a GPU is
    vLLM's own tensor, read by vLLM's kernels. vLLM gives Qwen4Exp's PLE tables no node-local group of
    replicas, so there dp_shared_memory leaves each DP replica its own ETP shard."""
    on_gpu = torch.cuda.is_available()
    if on_gpu and not config.cpu_offload:
        return None
    if family == "qwen" and config.dp_shared_memory and config.cpu_offload and not config.file_backed:
        log.warning(
            "engram: dp_shared_memory applies to DeepSeek V4.1's Engram tables; vLLM gives Qwen4Exp's PLE "
            "tables no node-local group of replicas, so each DP replica keeps its own ETP shard (embedding_across_dp "
            "spreads one copy over the replicas instead)"
        )
    return placement_for(config, "cuda" if on_gpu else "cpu", shareable=family == "deepseek")


def open_for(
    config: EngramConfig,
    vllm_config: Any,
    name: str,
    fmt: ShardFormat,
    where: Placement,
    *,
    row_start: int,
    table_rows: int,
    find: bool = False,
    group: Group | None = None,
) -> Table:
    """The table `name`, filled by vLLM's weight loaders (Table.weight_loader). With file_backed it is the
    pages of the model's checkpoint, under that checkpoint's resident-set budget; with node_sharing the
    node's copy of it, attached or loaded from that checkpoint now (vLLM's loaders then copy nothing).
    `find`: `name` is vLLM's module prefix, and the checkpoint's tensor is found by it (files.table_named)."""
    checkpoint = budget = None
    if where in ("file", "node"):
        model_dir = files.checkpoint_dir(vllm_config, config)
        checkpoint = files.checkpoint(model_dir)
        name = files.table_named(checkpoint, name) if find else name
        if where == "file" and config.file_cache_bytes:
            budget = files.budget(model_dir, config.file_cache_bytes)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return open_table(
        name, fmt, where, row_start=row_start, table_rows=table_rows, checkpoint=checkpoint, group=group,
        runtime=uva_runtime(), budget=budget, sharing=config.node_sharing, device=device,
    )  # fmt: skip


profile = functools.cache(configured_profile)  # one read per config: vLLM builds an equal one for each module


def give_tier(config: EngramConfig, name: str, table: Table, tables: int) -> None:
    """Give `table` (the rows this rank holds of the table vLLM names `name`, one of the model's `tables`)
    its tier, when one is configured. The profile names tables as the checkpoint does, which vLLM may
    prefix differently: its one table ending as `name` does from `layers.` on. The budget is split over
    the profile's tables where one is given, else over vLLM's count of them."""
    if not (config.device_cache_bytes or config.ram_cache_bytes):
        return
    hot = profile(config)
    tail = files.layer_tail(name)
    found = [] if hot is None else [t for t in hot if t == name or t.endswith(tail)]
    if len(found) > 1:
        raise EngramError(
            f"the profile {config.device_cache_profile} holds {len(found)} tables ending in {tail} ({', '.join(found[:3])}); profile this model with `engram profile --out`"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    among = len(hot) if hot is not None else tables
    keep_hot(config, [table], device, hot, among=among, profile_key=lambda _: found[0] if found else name)


class Served:
    """A module's engram table as its lookups use it: `table`, given its tier on the first lookup (`tiered`:
    whether it takes one; vLLM has loaded the weights by then, before any CUDA graph capture), each lookup's
    counters published under vLLM's name for it, `name`."""

    def __init__(self, config: EngramConfig, name: str, table: Table, tables: int, *, tiered: bool) -> None:
        self.config, self.name, self.table, self.tables = config, name, table, tables
        self._untiered = tiered  # a tier still to give

    def tiered(self) -> Table:
        """The table, given its tier if it is still to get one."""
        if self._untiered:
            give_tier(self.config, self.name, self.table, self.tables)
            self._untiered = False
        return self.table

    def lookup(self, ids: torch.Tensor, output: Output) -> torch.Tensor:
        """Table.lookup of `ids`, in `output`."""
        rows = self.tiered().lookup(ids, output=output)
        METRICS.observe(self.name, self.table, ids.device)
        return rows
