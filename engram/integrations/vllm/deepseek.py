"""DeepSeek V4.1's Engram tables in engram's storage, looked up by engram's gather: a subclass of vLLM
0.33's ParallelEngramEmbedding (its head sharding, weight loaders and collectives stay vLLM's), built by
Engram._create_embedding, vLLM's one factory for it, when engram is enabled for the model."""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.models.deepseek_v41.common import engram as vllm_engram

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm import files
from engram.integrations.vllm.cache import hot_cache
from engram.integrations.vllm.settings import engram_config
from engram.memory.mapping import Mapping, map_anonymous
from engram.memory.registration import register
from engram.ops import gather
from engram.runtime.cache import HotRows, cached_gather
from engram.runtime.dist import Group, barrier, timeout_s
from engram.runtime.placement.hugepages import map_huge
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.placement.shm import create_shared
from engram.runtime.placement.storage import ShardFormat, TableShard


def _load_unless_file_backed(param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """vLLM's head-shard weight loader, except for a file-backed table: its rows are the checkpoint's own
    read-only pages, so nothing is copied (a write would fault); the shapes are still checked."""
    if not getattr(param, "engram_file_backed", False):
        vllm_engram._engram_head_shard_weight_loader(param, loaded_weight)
        return
    rows = loaded_weight.narrow(0, param.engram_vocab_start, param.shape[0])  # type: ignore[attr-defined]
    if rows.shape != param.shape:
        raise EngramError(
            f"engram file-backed table: the checkpoint's rows {list(rows.shape)} do not fit {list(param.shape)}"
        )


class EngramParallelEmbedding(vllm_engram.ParallelEngramEmbedding):
    """Host tables (cpu_offload) in one exact-size engram mapping, weights then ue8m0 scales, huge pages
    with use_thp, registered for UVA on a GPU; with dp_shared_memory one memfd for the node's Engram DP
    group; with file_backed, views of the checkpoint's own pages (no load copy). Device tables and peer
    tables stay vLLM's. On the CPU engram's kernels gather (guarded for file-backed tables); on a GPU
    vLLM's kernel reads the mapping over UVA, except a file the GPU cannot read (files.staged), whose
    rows host threads gather and one copy takes to the GPU."""

    _weight_loader = staticmethod(_load_unless_file_backed)

    def __init__(self, *args: Any, engram: EngramConfig, table: str, checkpoint: str | None, **kwargs: Any) -> None:
        self._engram = engram
        self._table = table  # the checkpoint's name for it: layers.{id}.engram.embed
        self._checkpoint = checkpoint
        self._mappings: list[Mapping] = []
        self._file_shard: TableShard | None = None
        self._budget: ResidentBudget | None = None  # file_cache_bytes, shared by the checkpoint's tables
        self._cache: HotRows | None = None  # device_cache_bytes: built on the first lookup (weights loaded)
        self._cache_built = False
        self._group: Group | None = None  # the node's Engram DP group, for shared tables
        super().__init__(*args, **kwargs)
        if self._file_shard is not None:
            for param in (self.weight, self.weight_scale_inv):
                param.engram_file_backed = True

    def _allocate_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        on_gpu = torch.cuda.is_available()
        vllms = torch.get_default_device().type == "meta" or self.peer_rows
        if vllms or (on_gpu and not self.cpu_offload):
            return super()._allocate_weights()
        if self._engram.file_backed:
            return self._file_backed()
        fmt = ShardFormat(self.part_num_embeddings, self.dim, "fp8")
        if self.dp_shared_memory:
            mapping = self._shared(fmt)
        elif self._engram.use_thp:
            mapping = map_huge(fmt.nbytes).mapping
        else:
            mapping = map_anonymous(fmt.nbytes, kind="host")
        if on_gpu:
            from engram.ops.cuda import library_runtime

            register(mapping, library_runtime())
        self._mappings.append(mapping)
        weight = mapping.view(0, fmt.weight_shape, torch.float8_e4m3fn)
        return weight, mapping.view(fmt.scale_offset, fmt.scale_shape, torch.uint8)

    def _shared(self, fmt: ShardFormat) -> Mapping:
        """One copy for vLLM's node-local Engram DP group: an anonymous memfd the group's leader makes and
        hands to the others (engram.runtime.placement.memfd), so no crash at any instant leaves a file
        behind. Weights load through the leader only, every member meeting at a barrier after each."""
        coordinator = vllm_engram.get_engram_dp_group()
        if coordinator is None:
            raise EngramError("dp_shared_memory needs vLLM's node-local Engram DP group, and it has none here")
        group = Group(coordinator.cpu_group, tuple(coordinator.ranks), "vLLM's Engram DP group", timeout_s())
        self._group = group
        self._weight_loader = self._load_shared
        return create_shared(fmt.nbytes, group, tag=self._table.replace(".", "-"))

    def _load_shared(self, param: torch.nn.Parameter, loaded_weight: torch.Tensor) -> None:
        assert self._group is not None
        if self._group.rank == 0:
            vllm_engram._engram_head_shard_weight_loader(param, loaded_weight)
        barrier(self._group, f"load {self._table}")

    def _file_backed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the table, in place in the checkpoint's safetensors file."""
        assert self._checkpoint is not None
        fmt = ShardFormat(self.part_num_embeddings, self.dim, "fp8")
        shard = files.map_rows(self._checkpoint, self._table, fmt, self.vocab_start_idx, self.num_embeddings)
        self._file_shard = shard
        self._budget = files.file_budget(self._checkpoint, self._engram.file_cache_bytes, shard)
        assert shard.scale is not None
        return shard.weight, shard.scale.view(torch.uint8)

    def lookup(self, indices: torch.Tensor, out: torch.Tensor, background: bool = False) -> None:
        """As vLLM's: this rank's heads of `indices` [T, n_hash_cols] into `out`, dequantised bf16 [T, heads,
        dim] or packed bytes (values, then scales, per head); heads past the last and rows of other ranks
        read zeros."""
        shard, cache = self._file_shard, self._hot_rows()
        if not indices.shape[0] or (indices.is_cuda and cache is None and not files.staged(shard)):
            super().lookup(indices, out, background)
            return
        packed, ids = out.dtype == torch.uint8, self._own_ids(indices)
        if shard is None or (indices.is_cuda and not files.staged(shard)):
            rows = self._engram_rows(ids, packed, cache)
        else:  # host reads of this rank's heads' rows alone: the other heads' rows are other ranks'
            rows = files.staged_rows(shard, ids, lambda own: self._engram_rows(own, packed, cache), self._budget)
        if packed:
            out[:, : rows.shape[1]].copy_(rows)
        else:
            out.view(indices.shape[0], self.part_n_hash_cols, self.dim).copy_(rows)

    def _hot_rows(self) -> HotRows | None:
        """This rank's device cache of the table (device_cache_bytes), built on the first lookup."""
        if not self._cache_built and not self.peer_rows and self.cpu_offload:
            shard = self._file_shard or TableShard(
                self._table, self.vocab_start_idx, ShardFormat(self.part_num_embeddings, self.dim, "fp8"), "pinned",
                self.weight.data, self.weight_scale_inv.data.view(torch.float8_e8m0fnu),
            )  # fmt: skip
            self._cache = hot_cache(self._engram, self._table, shard)
        self._cache_built = True
        return self._cache

    def _own_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """int64 [T, part_n_hash_cols]: the columns of this rank's heads, -1 (zeros) for heads past the last."""
        heads = self.part_n_hash_cols
        ids = indices[:, self.head_start : self.head_start + heads].to(torch.int64)
        return torch.nn.functional.pad(ids, (0, heads - ids.shape[1]), value=-1) if ids.shape[1] < heads else ids

    def _engram_rows(self, ids: torch.Tensor, packed: bool, cache: HotRows | None) -> torch.Tensor:
        """engram's gather of this rank's heads' ids (_own_ids; hits from the device cache when there is
        one): packed bytes [T, heads x (dim + scales)] or bf16 [T, heads, dim]."""
        weight, scales = self.weight.data, self.weight_scale_inv.data.view(torch.float8_e8m0fnu)
        start, table_rows = self.vocab_start_idx, self.num_embeddings

        def rows(
            part: torch.Tensor, scale: torch.Tensor | None, hot: HotRows | None, dtype: torch.dtype
        ) -> torch.Tensor:
            if hot is None:
                return gather(part, scale, ids, start, table_rows, dtype)
            return cached_gather(hot, part, scale, ids, start, table_rows, dtype)

        if packed:  # raw bytes: the cache's rows and scales, each gathered as it is stored
            hot_values = hot_blocks = None
            if cache is not None and cache.scale is not None:
                hot_values = HotRows(cache.ids, cache.weight.view(torch.uint8), None)
                hot_blocks = HotRows(cache.ids, cache.scale.view(torch.uint8), None)
            values = rows(weight.view(torch.uint8), None, hot_values, torch.uint8)
            blocks = rows(scales.view(torch.uint8), None, hot_blocks, torch.uint8)
            return torch.cat([values, blocks], dim=2).reshape(ids.shape[0], -1)
        return rows(weight, scales, cache, torch.bfloat16)


_VLLMS_FACTORY = vllm_engram.Engram._create_embedding


def create_embedding(self: Any, layout: Any, layer_hash_index: int) -> Any:
    """Engram._create_embedding: engram's table where engram is enabled, vLLM's own otherwise."""
    vllm_config = get_current_vllm_config()
    config = engram_config(vllm_config)
    if config is None:
        return _VLLMS_FACTORY(self, layout, layer_hash_index)
    checkpoint = files.checkpoint_dir(vllm_config) if config.file_backed else None
    return EngramParallelEmbedding(
        layout.num_embeddings[layer_hash_index],
        layout.head_dim,
        tuple(size for order in layout.primes[layer_hash_index] for size in order),
        cpu_offload=config.cpu_offload,
        dp_shared_memory=bool(config.dp_shared_memory),
        use_thp=config.use_thp,
        engram=config,
        table=f"layers.{layout.layer_ids[layer_hash_index]}.engram.embed",
        checkpoint=checkpoint,
    )


def install() -> None:
    """Route vLLM's factory through create_embedding (once per process)."""
    if vllm_engram.Engram._create_embedding is not create_embedding:
        vllm_engram.Engram._create_embedding = create_embedding
