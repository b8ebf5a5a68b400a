"""DeepSeek V4.1's Engram tables inside SGLang: SGLang's EngramEmbedding (sglang.srt.layers.engram), with
each rank's rows (SGLang's own shard_range) held and looked up by engram's table layer wherever engram is
enabled (settings.engram_config), and exactly SGLang's class elsewhere.

SGLang's contract is kept: the parameters `weight` and `scale` with weight loaders that take the whole
table and keep this rank's rows; `finish_load(label)` after every weight (here it gives the table its
tier of hot rows; nothing collective); `forward` and `dequant_staged` as SGLang's, whose lookups reach
the rows through `_owned_rows` (this rank's rows, zeros for the others), then SGLang's all-reduce or
DP-attention collectives; `host_table` None (SGLang's whole-step kernel plugin accepts that)."""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from engram.integrations import model_tables
from engram.integrations.sglang.settings import engram_config, model_dir
from engram.runtime.table import ShardFormat, Table

# The engram-served tables of this process: a tier's budget is split over them (SGLang builds every layer
# before it loads a weight, so all are here when the first finish_load gives its tier).
_SERVED: weakref.WeakSet[Any] = weakref.WeakSet()


def table_name(layer_id: int) -> str:
    """The checkpoint's name for layer `layer_id`'s table, from `layers.` on."""
    return f"layers.{layer_id}.engram.embed"


def embedding_class(theirs: type) -> type:
    """engram's subclass of SGLang's EngramEmbedding class `theirs` (module docstring)."""
    from sglang.srt.layers.engram import shard_range
    from sglang.srt.runtime_context import get_parallel

    class EngramEmbedding(theirs):
        """SGLang's DeepSeek V4.1 Engram table, served by engram where ENGRAM_SGLANG_CONFIG enables it."""

        engram: Table | None = None

        def __init__(self, num_embeddings: int, dim: int, layer_id: int, column_bounds: tuple[int, ...]) -> None:
            config = engram_config()
            where = None if config is None else model_tables.placement(config, shareable=False)
            if config is None or where is None:  # not enabled, or a device table SGLang keeps itself
                super().__init__(num_embeddings, dim, layer_id, column_bounds)
                return
            nn.Module.__init__(self)
            parallel = get_parallel()
            self.dim, self.tp_size = dim, parallel.tp_size
            self.row_start, row_end = shard_range(num_embeddings, column_bounds, parallel.tp_rank, self.tp_size)
            self.rows = row_end - self.row_start
            self.host_table, self.peer = None, None  # SGLang's own layouts: none of them here
            self._sort_host_reads, self.staged_by_scheduler = False, False
            self.config, self.name = config, table_name(layer_id)
            reads_checkpoint = where in ("file", "node")
            table = model_tables.open_model_table(
                config, model_dir(config) if reads_checkpoint else None, self.name, ShardFormat(self.rows, dim, "fp8"),
                where, row_start=self.row_start, table_rows=num_embeddings, find=reads_checkpoint,
            )  # fmt: skip
            self.engram, self._untiered = table, True
            self.weight = model_tables.loaded_parameter(table, "weight")
            self.scale = model_tables.loaded_parameter(table, "scale")
            _SERVED.add(self)

        def finish_load(self, label: str) -> None:
            """After every weight: SGLang's (its layouts' collectives), then the tier of hot rows."""
            super().finish_load(label)
            if self.engram is not None and self._untiered:
                model_tables.give_tier(self.config, self.name, self.engram, len(_SERVED))
                self._untiered = False

        def _owned_rows(self, indices: torch.Tensor) -> torch.Tensor:
            """This rank's rows of `indices` in bf16 (zeros for the others' rows), from engram's table."""
            if self.engram is None:
                return super()._owned_rows(indices)
            return self.engram.lookup(indices, output=torch.bfloat16)

    EngramEmbedding.__qualname__ = EngramEmbedding.__name__ = theirs.__name__
    EngramEmbedding.__module__ = __name__
    return EngramEmbedding
