"""Qwen4Exp's PLE tables inside SGLang: SGLang's Qwen4ExpPinnedHostEmbedding (the table its
--ple-offload-embedding keeps off the GPU, sglang.srt.models.qwen4_exp), with each TP rank's vocabulary
shard (SGLang's VocabParallelEmbedding: org_vocab_start_index on) held and looked up by engram's table
layer wherever engram is enabled (settings.engram_config), and exactly SGLang's class elsewhere.

SGLang's contract is kept: the parameter `weight` with a loader that takes the whole table and keeps this
rank's rows; `gather(input_ids, out=None)` giving bf16 rows as stored (SGLang multiplies by the table's
weight_scale after it), zeros for rows other ranks hold, into `out` when given (the prefetch on a side
stream); SGLang's `allocate_output`, `reduce` and `forward`. The tier of hot rows is given on the first
gather, once SGLang has loaded the weights. The table's name in the checkpoint is its module's prefix,
which SGLang's Qwen4ExpNGramEmbedding knows and the table class is not given: named_by_module records it
while that module builds."""

from __future__ import annotations

import contextvars
import inspect
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from engram.errors import EngramError
from engram.integrations import model_tables
from engram.integrations.sglang.settings import engram_config, model_dir
from engram.runtime.table import ShardFormat, Table

_BUILDING: contextvars.ContextVar[str | None] = contextvars.ContextVar("engram_sglang_ple_prefix", default=None)
# The engram-served PLE tables of this process: a tier's budget is split over them (SGLang builds every
# layer before its first gather gives a tier).
_SERVED: weakref.WeakSet[Any] = weakref.WeakSet()
ROW_FORMATS = {torch.bfloat16: "bf16"}  # stored as SGLang's gather reads them, with no scale to apply


def named_by_module(original: Callable[..., None], module: Any, *args: Any, **kwargs: Any) -> None:
    """An AROUND hook of Qwen4ExpNGramEmbedding.__init__: its `prefix` is known to the PLE table class it
    builds (_BUILDING) while it runs."""
    prefix = inspect.signature(original).bind(module, *args, **kwargs).arguments.get("prefix", "")
    token = _BUILDING.set(f"{prefix}.ngram_embedding" if prefix else "ngram_embedding")
    try:
        original(module, *args, **kwargs)
    finally:
        _BUILDING.reset(token)


def pinned_host_class(theirs: Any) -> type:
    """engram's subclass of SGLang's Qwen4ExpPinnedHostEmbedding class `theirs` (module docstring)."""

    class Qwen4ExpPinnedHostEmbedding(theirs):
        """SGLang's offloaded PLE table, served by engram where ENGRAM_SGLANG_CONFIG enables it."""

        engram: Table | None = None

        def __init__(self, embedding: Any, *, backend: str = "pinned", table_dir: str | None = None) -> None:
            config = engram_config()
            where = None if config is None else model_tables.placement(config, shareable=False)
            if config is None or where is None:
                super().__init__(embedding, backend=backend, table_dir=table_dir)
                return
            nn.Module.__init__(self)
            dtype = embedding.weight.dtype
            if dtype not in ROW_FORMATS or embedding.num_added_embeddings:
                raise EngramError(
                    f"engram serves SGLang's bf16 Qwen4Exp PLE tables without added rows, not {dtype} ones: unset "
                    "ENGRAM_SGLANG_CONFIG for this model"
                )
            for name in theirs._COPIED_ATTRIBUTES:
                setattr(self, name, getattr(embedding, name))
            self.quant_method = None  # as SGLang's: the generic loader leaves this CPU table where it is
            self._file_prefetcher = self._file_rss_trimmer = None  # SGLang's file backend's: engram's own instead
            shard = self.shard_indices
            start, stop = shard.org_vocab_start_index, shard.org_vocab_end_index
            self.config, self.name = config, _BUILDING.get() or "ngram_embedding"
            reads_checkpoint = where in ("file", "node")
            table = model_tables.open_model_table(
                config, model_dir(config) if reads_checkpoint else None, self.name, ShardFormat(stop - start, self.embedding_dim, ROW_FORMATS[dtype]),
                where, row_start=start, table_rows=self.org_vocab_size, find=reads_checkpoint,
            )  # fmt: skip
            self.engram, self._untiered = table, True
            weight = model_tables.loaded_parameter(table, "weight")
            for name, value in vars(embedding.weight).items():  # SGLang's loading attributes (output_dim, ...)
                setattr(weight, name, value)
            weight.weight_loader = table.weight_loader("weight")  # type: ignore[attr-defined]  # after SGLang's attributes
            self.register_parameter("weight", weight)
            self.register_buffer("weight_scale", embedding.weight_scale, persistent=True)
            del embedding.weight
            _SERVED.add(self)

        def gather(self, input_ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
            """This rank's bf16 rows of `input_ids` (zeros for other ranks' rows), as SGLang's gather."""
            if self.engram is None:
                return super().gather(input_ids, out)
            expected = (*input_ids.shape, self.embedding_dim)
            if out is not None and (tuple(out.shape) != expected or out.dtype != torch.bfloat16):
                raise EngramError(
                    f"a PLE prefetch buffer must be bfloat16 {list(expected)}, got {out.dtype} {list(out.shape)}"
                )
            if self._untiered:  # the first gather: SGLang has loaded the weights by now
                model_tables.give_tier(self.config, self.name, self.engram, len(_SERVED))
                self._untiered = False
            output = out if out is not None else self.allocate_output(expected, input_ids.device)
            return output.copy_(self.engram.lookup(input_ids, output=torch.bfloat16))

    Qwen4ExpPinnedHostEmbedding.__qualname__ = Qwen4ExpPinnedHostEmbedding.__name__ = theirs.__name__
    Qwen4ExpPinnedHostEmbedding.__module__ = __name__
    return Qwen4ExpPinnedHostEmbedding
