"""vLLM 0.34's disk-offload PLE table (EngramConfig.disk_offload), served by engram where engram is enabled:
the same rows from the same checkpoint files, but through engram's file-backed table (the safetensors
pages of the whole table or of its `shard_<k>` parts, gathered by the guarded CPU kernel, the page cache
read ahead per lookup) with its RAM tier (ram_cache_bytes) and page-cache bound (file_cache_bytes) over
it, instead of vLLM's one pread per row. vLLM's own staging stays: its pinned host planes and the device
buffers the forward reads (so CUDA graphs replay it), filled here from engram's lookup."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpPLEDiskOffloadEmbedding

from engram.errors import EngramError
from engram.integrations.vllm.qwen import init_engram, load_weight, open_engram_table, row_format
from engram.integrations.vllm.tables import Served
from engram.runtime.table import PACKED, Part, ShardFormat


class EngramQwenDiskOffloadEmbedding(Qwen4ExpPLEDiskOffloadEmbedding):
    """Qwen4ExpPLEDiskOffloadEmbedding with engram's file-backed table behind stage_rows. As vLLM's, every
    ETP rank stages full rows (the whole table, no ETP reduction) and nothing is allocated for the table;
    the checkpoint tensors vLLM's loader hands over are checked by vLLM's accept_checkpoint_shard and let go once
    bound (engram maps the files itself)."""

    _served: Served | None
    _bound: bool  # vLLM's: whether bind_file_shards has run
    # The layers whose ids this step has copied (stage_checkpoint_rows copies every layer's before any
    # stage_rows): the step's first stage_rows starts all their reads at once (Table.prefetch).
    _copied: ClassVar[list[EngramQwenDiskOffloadEmbedding]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """vLLM's constructor, then engram's file-backed table of the whole table over the checkpoint (its
        tensors found and checked against the model before any weight loads)."""
        init_engram(self)
        super().__init__(*args, **kwargs)
        if self._engram is not None:
            fmt = ShardFormat(self.org_vocab_size, self.embedding_dim, row_format(self.quant_method, self.weight.dtype))
            open_engram_table(self, fmt, "file", row_start=0, table_rows=self.org_vocab_size, tiered=True)

    def weight_loader(
        self, param: torch.Tensor, loaded_weight: torch.Tensor, checkpoint_start: int | None = None
    ) -> None:
        """A table stored whole (vLLM's disk offload takes `shard_<k>` parts only; engram serves both) goes
        to the table's loader, its rows staying in the file (qwen.load_weight); every other parameter
        loads as vLLM loads it."""
        part: Part | None = "weight" if param is self.weight else None
        load_weight(self, part, param, loaded_weight, checkpoint_start, super().weight_loader)

    def bind_file_shards(self) -> None:
        """Once vLLM's loader is done: engram's table checked against vLLM's staging planes and given its
        RAM tier when one is configured."""
        served = self._served
        if served is None:
            super().bind_file_shards()
            return
        if self._bound:
            raise RuntimeError("PLE disk offload does not support weight reload")
        table, fmt = served.table, served.table.shard.format
        row_bytes = sum(host.shape[-1] * host.element_size() for _, host, _ in self._planes.values())
        if row_bytes != fmt.row_bytes:
            raise EngramError(
                f"engram: vLLM stages {row_bytes}-byte rows of {table.name}, engram's {fmt.dtype} table has {fmt.row_bytes}"
            )
        served.tiered()  # its RAM tier now: the step's first stage_rows prefetches through it
        self._shards.clear()  # the loader's views of the parts, checked by vLLM's accept_checkpoint_shard
        self._bound = True

    def copy_ids_to_host(self, ids: torch.Tensor) -> None:
        super().copy_ids_to_host(ids)
        if self._served is not None:
            self._copied.append(self)

    def stage_rows(self, num_tokens: int) -> None:
        """This step's rows (vLLM's _host_ids[:num_tokens], [T, H]) as stored, into vLLM's pinned planes
        (rows, then NVFP4's block scales) and on to its device buffers, as vLLM's stage_rows leaves them."""
        if self._served is None:
            super().stage_rows(num_tokens)
            return
        ids = self._host_ids[:num_tokens]
        if self._copied:  # the step's first: every layer's reads start now, its own first
            for layer in self._copied:
                assert layer.engram_table is not None
                layer.engram_table.prefetch(layer._host_ids[:num_tokens])
            self._copied.clear()
        rows = self._served.lookup(ids, PACKED)  # [T, H, row_bytes]: each row's stored bytes, its scales after
        at = 0
        for _, host, _ in self._planes.values():
            width = host.shape[-1] * host.element_size()
            host[:num_tokens].view(torch.uint8).copy_(rows[..., at : at + width])
            at += width
        for staging, host, _ in self._planes.values():
            staging[:num_tokens].copy_(host[:num_tokens], non_blocking=True)
