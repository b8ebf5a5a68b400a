"""DeepSeek V4.1's Engram tables in engram's storage, looked up by engram's gather: a subclass of vLLM
0.33's ParallelEngramEmbedding (its head sharding, weight loaders and collectives stay vLLM's), built by
Engram._create_embedding, vLLM's one factory for it, when engram is enabled for the model."""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.models.deepseek_v41.common import engram as vllm_engram

from engram.config import EngramConfig
from engram.integrations.vllm.settings import engram_config
from engram.memory.mapping import Mapping, map_anonymous
from engram.memory.registration import register
from engram.ops import gather
from engram.runtime.placement.hugepages import map_huge
from engram.runtime.placement.storage import ShardFormat


class EngramParallelEmbedding(vllm_engram.ParallelEngramEmbedding):
    """Host tables (cpu_offload) in one exact-size engram mapping, weights then ue8m0 scales, huge pages
    with use_thp, registered for UVA on a GPU; device tables, shared tables (dp_shared_memory) and peer
    tables stay vLLM's. On the CPU engram's kernels gather; on a GPU vLLM's kernel reads the mapping."""

    def __init__(self, *args: Any, engram: EngramConfig, **kwargs: Any) -> None:
        self._engram = engram
        self._mappings: list[Mapping] = []
        super().__init__(*args, **kwargs)

    def _allocate_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        on_gpu = torch.cuda.is_available()
        vllms = torch.get_default_device().type == "meta" or self.peer_rows or self.dp_shared_memory
        if vllms or (on_gpu and not self.cpu_offload):
            return super()._allocate_weights()
        fmt = ShardFormat(self.part_num_embeddings, self.dim, "fp8")
        mapping = map_huge(fmt.nbytes).mapping if self._engram.use_thp else map_anonymous(fmt.nbytes, kind="host")
        if on_gpu:
            from engram.ops.cuda import library_runtime

            register(mapping, library_runtime())
        self._mappings.append(mapping)
        weight = mapping.view(0, fmt.weight_shape, torch.float8_e4m3fn)
        return weight, mapping.view(fmt.scale_offset, fmt.scale_shape, torch.uint8)

    def lookup(self, indices: torch.Tensor, out: torch.Tensor, background: bool = False) -> None:
        """As vLLM's: this rank's heads of `indices` [T, n_hash_cols] into `out`, dequantised bf16 [T, heads,
        dim] or packed bytes (values, then scales, per head); heads past the last and rows of other ranks
        read zeros."""
        if indices.is_cuda or not indices.shape[0]:
            super().lookup(indices, out, background)
            return
        heads = self.part_n_hash_cols
        ids = indices[:, self.head_start : self.head_start + heads].to(torch.int64)
        if ids.shape[1] < heads:
            ids = torch.nn.functional.pad(ids, (0, heads - ids.shape[1]), value=-1)
        weight, scales = self.weight.data, self.weight_scale_inv.data
        start, table_rows = self.vocab_start_idx, self.num_embeddings
        if out.dtype == torch.uint8:
            values = gather(weight.view(torch.uint8), None, ids, start, table_rows, torch.uint8)
            blocks = gather(scales, None, ids, start, table_rows, torch.uint8)
            packed = torch.cat([values, blocks], dim=2).reshape(ids.shape[0], -1)
            out[:, : packed.shape[1]].copy_(packed)
        else:
            rows = gather(weight, scales.view(torch.float8_e8m0fnu), ids, start, table_rows, torch.bfloat16)
            out.view(ids.shape[0], heads, self.dim).copy_(rows)


_VLLMS_FACTORY = vllm_engram.Engram._create_embedding


def create_embedding(self: Any, layout: Any, layer_hash_index: int) -> Any:
    """Engram._create_embedding: engram's table where engram is enabled, vLLM's own otherwise."""
    config = engram_config(get_current_vllm_config())
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
    )


def install() -> None:
    """Route vLLM's factory through create_embedding (once per process)."""
    if vllm_engram.Engram._create_embedding is not create_embedding:
        vllm_engram.Engram._create_embedding = create_embedding
