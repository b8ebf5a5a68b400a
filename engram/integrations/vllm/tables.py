"""The engram table behind one of vLLM's table modules: where it lives (the engine's rule), the checkpoint
it is served or loaded from, the tier of hot rows it gets on its first lookup (engram.integrations.
model_tables, shared with the SGLang plugin), and its lookups, whose counters reach vLLM's /metrics."""

from __future__ import annotations

import logging
from typing import Any

import torch

from engram.config import EngramConfig
from engram.integrations import model_tables
from engram.integrations.vllm import files
from engram.integrations.vllm.metrics import METRICS
from engram.runtime.table import Group, Output, Placement, ShardFormat, Table

log = logging.getLogger("engram")


def placement(config: EngramConfig, family: str) -> Placement | None:
    """Where engram keeps a table of `family` ("deepseek" or "qwen") inside vLLM (model_tables.placement).
    vLLM gives Qwen4Exp's PLE tables no node-local group of replicas, so there dp_shared_memory leaves each
    DP replica its own ETP shard."""
    if family == "qwen" and config.dp_shared_memory and config.cpu_offload and not config.file_backed:
        log.warning(
            "engram: dp_shared_memory applies to DeepSeek V4.1's Engram tables; vLLM gives Qwen4Exp's PLE "
            "tables no node-local group of replicas, so each DP replica keeps its own ETP shard (embedding_across_dp "
            "spreads one copy over the replicas instead)"
        )
    return model_tables.placement(config, shareable=family == "deepseek")


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
    """The table `name` of the model vLLM builds (model_tables.open_model_table over its checkpoint)."""
    model_dir = files.checkpoint_dir(vllm_config, config) if where in ("file", "node") else None
    return model_tables.open_model_table(
        config, model_dir, name, fmt, where, row_start=row_start, table_rows=table_rows, find=find, group=group
    )


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
            model_tables.give_tier(self.config, self.name, self.table, self.tables)
            self._untiered = False
        return self.table

    def lookup(self, ids: torch.Tensor, output: Output) -> torch.Tensor:
        """Table.lookup of `ids`, in `output`."""
        rows = self.tiered().lookup(ids, output=output)
        METRICS.observe(self.name, self.table, ids.device)
        return rows
