"""DeepSeek V4.1's Engram tables served by engram's table layer: a subclass of vLLM 0.33's
ParallelEngramEmbedding (its head sharding and collectives stay vLLM's), built by Engram._create_embedding,
vLLM's one factory for it, when engram is enabled for the model."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.models.deepseek_v41.common import engram as vllm_engram

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm.settings import engram_config
from engram.integrations.vllm.tables import Served, open_for, placement
from engram.runtime.table import PACKED, ShardFormat, Table, as_parameter, shared_group


class EngramParallelEmbedding(vllm_engram.ParallelEngramEmbedding):
    """vLLM's head shard of a table (vocab_start_idx and part_num_embeddings: a row range) served by engram's
    table layer (engram.runtime.table), placed as engram's engine places it: an exact host mapping
    registered for UVA on a GPU, huge pages with use_thp, one memfd for the node's Engram DP group with
    dp_shared_memory, the checkpoint's own pages with file_backed. vLLM's weight loaders call the table's
    (the shared table's leader alone copies; a file-backed table copies nothing). Device tables on a GPU
    and peer tables stay vLLM's. On the CPU engram's gather serves every lookup; on a GPU vLLM's kernel
    reads the mapping over UVA, except where engram's table must: a device cache, or a file the GPU cannot
    read (its rows gathered by host threads, one copy to the GPU)."""

    def __init__(
        self, *args: Any, engram: EngramConfig, table: str, vllm_config: Any, tables: int, **kwargs: Any
    ) -> None:
        self._engram = engram
        self._tables = tables  # the model's Engram tables, over which a tier's budget is split
        self._table_name = table  # the checkpoint's name for it: layers.{id}.engram.embed
        self._vllm_config = vllm_config
        self.engram_table: Table | None = None
        self._served: Served | None = None
        super().__init__(*args, **kwargs)
        if self.engram_table is not None:
            self.weight.weight_loader = self.engram_table.weight_loader("weight")
            self.weight_scale_inv.weight_loader = self.engram_table.weight_loader("scale")

    def _allocate_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        where = placement(self._engram, "deepseek")
        if (
            where is None or torch.get_default_device().type == "meta" or getattr(self, "peer_rows", False)
        ):  # 0.32: none
            return super()._allocate_weights()
        group = None
        if where == "shm":  # one copy for vLLM's node-local Engram DP group, loaded by its leader
            coordinator = vllm_engram.get_engram_dp_group()
            if coordinator is None:
                raise EngramError("dp_shared_memory needs vLLM's node-local Engram DP group, and it has none here")
            group = shared_group(coordinator.cpu_group, coordinator.ranks, "vLLM's Engram DP group")
        self.engram_table = table = open_for(
            self._engram, self._vllm_config, self._table_name, ShardFormat(self.part_num_embeddings, self.dim, "fp8"),
            where, row_start=self.vocab_start_idx, table_rows=self.num_embeddings, group=group,
        )  # fmt: skip
        self._served = Served(self._engram, self._table_name, table, self._tables, tiered=self._engram.cpu_offload)
        assert table.scale is not None
        return as_parameter(table.weight), as_parameter(table.scale).view(
            torch.uint8
        )  # vLLM keeps ue8m0 scales as bytes

    @property
    def _uses_small_host_pages(self) -> bool:
        """vLLM 0.34's question before its kernel reads a host table (it sorts the ids where the GPU maps
        the table with small pages): for engram's table, whether it is memory the GPU maps with small pages,
        not host-NUMA cuMem."""
        table = self.engram_table
        if table is None:
            return bool(getattr(super(), "_uses_small_host_pages", self.cpu_offload))
        mapping = table.shard.mapping
        return bool(self.cpu_offload and not (mapping is not None and mapping.gpu_page))

    def lookup(self, indices: torch.Tensor, out: torch.Tensor, background: bool = False) -> None:
        """As vLLM's: this rank's heads of `indices` [T, n_hash_cols] into `out`, dequantised bf16 [T, heads,
        dim] or packed bytes (values, then scales, per head); heads past the last and rows of other ranks
        read zeros."""
        served = self._served
        table = None if served is None else served.tiered()
        if table is None or not indices.shape[0] or (indices.is_cuda and table.tier is None and not table.shard.staged):
            super().lookup(indices, out, background)
            return
        assert served is not None
        tokens, heads = indices.shape[0], self.part_n_hash_cols
        ids = indices[:, self.head_start : self.head_start + heads].to(torch.int64)
        if ids.shape[1] < heads:  # heads past the last read zeros
            ids = torch.nn.functional.pad(ids, (0, heads - ids.shape[1]), value=-1)
        if out.dtype == torch.uint8:
            rows = served.lookup(ids, PACKED)
            out[:, : rows.shape[1] * rows.shape[2]].copy_(rows.reshape(tokens, -1))
        else:
            out.view(tokens, heads, self.dim).copy_(served.lookup(ids, torch.bfloat16))


_VLLMS_FACTORY = vllm_engram.Engram._create_embedding


def create_embedding(self: Any, layout: Any, layer_hash_index: int) -> Any:
    """Engram._create_embedding: engram's table where engram is enabled, vLLM's own otherwise."""
    vllm_config = get_current_vllm_config()
    config = engram_config(vllm_config)
    if config is None:
        return _VLLMS_FACTORY(self, layout, layer_hash_index)
    return EngramParallelEmbedding(
        layout.num_embeddings[layer_hash_index],
        layout.head_dim,
        tuple(size for order in layout.primes[layer_hash_index] for size in order),
        cpu_offload=config.cpu_offload,
        dp_shared_memory=bool(config.dp_shared_memory),
        use_thp=config.use_thp,
        engram=config,
        table=f"layers.{layout.layer_ids[layer_hash_index]}.engram.embed",
        vllm_config=vllm_config,
        tables=len(layout.layer_ids),
    )


def install() -> Callable[[], None]:
    """Route vLLM's factory through create_embedding (once per process); returns the undo."""
    if vllm_engram.Engram._create_embedding is create_embedding:
        return lambda: None
    vllm_engram.Engram._create_embedding = create_embedding

    def undo() -> None:
        vllm_engram.Engram._create_embedding = _VLLMS_FACTORY

    return undo
