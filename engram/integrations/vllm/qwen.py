"""Qwen4Exp's PLE tables in engram's storage, looked up by engram's gather: subclasses of vLLM 0.33's own
table classes (their constructors, quantisation methods and weight loaders stay vLLM's), swapped in by
name. Where engram is not enabled for the model every method is vLLM's own."""

from __future__ import annotations

from typing import Any

import torch
from vllm.config import get_current_vllm_config
from vllm.models.qwen4_exp.common.ngram_embedding import (
    Qwen4ExpPLEDeviceEmbedding,
    Qwen4ExpPLENvFp4EmbeddingMethod,
    Qwen4ExpPLEPinnedHostEmbedding,
)

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm.settings import engram_config
from engram.memory.mapping import Mapping, map_anonymous
from engram.ops import gather
from engram.runtime.placement.hugepages import map_huge


def _config() -> EngramConfig | None:
    return engram_config(get_current_vllm_config())


class EngramStorage:
    """What the swapped classes add: tables in engram's mappings (exact size, huge pages with use_thp),
    kept alive with the module, and rows gathered by engram's kernels."""

    _engram: EngramConfig | None
    _mappings: list[Mapping]

    def _host_table(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = max(1, rows * width * dtype.itemsize)
        mapping = map_huge(nbytes).mapping if self._engram.use_thp else map_anonymous(nbytes, kind="host")  # type: ignore[union-attr]
        self._mappings.append(mapping)
        return mapping.view(0, (rows, width), dtype)

    def _engram_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows for global ids [T, H] (zeros for rows other ETP ranks own), as vLLM's
        quantisation method returns them: stored rows (fp8 stays fp8), NVFP4 dequantised."""
        method = self.embedding_method  # type: ignore[attr-defined]
        start = self.shard_indices.org_vocab_start_index  # type: ignore[attr-defined]
        table_rows = self.num_embeddings_padded  # type: ignore[attr-defined]
        weight = self.weight  # type: ignore[attr-defined]
        if isinstance(method, Qwen4ExpPLENvFp4EmbeddingMethod):
            scale = self.weight_scale.data  # type: ignore[attr-defined]
            table_scale = float(self.weight_scale_2.data.reshape(-1)[0])  # type: ignore[attr-defined]
            return gather(weight.data, scale, ids, start, table_rows, self.params_dtype, table_scale=table_scale)  # type: ignore[attr-defined]
        return gather(weight.data, None, ids, start, table_rows, weight.dtype)


def _init_engram(module: Any) -> None:
    config = _config()
    if config is not None and config.file_backed:
        raise EngramError(
            "engram setting 'file_backed': Qwen4Exp tables are not served from the checkpoint's file inside vLLM yet (DeepSeek V4.1's are); set it to false"
        )
    module._engram = config
    module._mappings = []


class EngramQwenDeviceEmbedding(EngramStorage, Qwen4ExpPLEDeviceEmbedding):
    """Qwen4ExpPLEDeviceEmbedding (cpu_offload false). On vLLM's CPU platform engram keeps the table in a
    mapping of its own and gathers with its CPU kernels; on a GPU the table stays vLLM's device tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _init_engram(self)
        super().__init__(*args, **kwargs)

    def allocate_embedding_weight(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self._engram is None or torch.cuda.is_available():
            return super().allocate_embedding_weight(num_embeddings, embedding_dim, dtype)
        return self._host_table(num_embeddings, embedding_dim, dtype)

    def forward(self, ngram_ids: torch.Tensor) -> torch.Tensor:
        if self._engram is None or ngram_ids.is_cuda:  # a GPU's table is vLLM's device tensor: its forward
            return super().forward(ngram_ids)
        slot_size, slot_offset = self._get_dp_gather_slot(ngram_ids.shape[0])
        gathered = self._gather_dp_ids(ngram_ids, slot_size)
        rows = self._engram_rows(gathered)
        if self.tp_size > 1 and self.reduce_results:  # one owner per row: the sum is exact, fp8 as bytes
            raw = rows.view(torch.int8) if rows.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else rows
            rows = self.parallel_group.all_reduce(raw).view(rows.dtype)
        return self._select_embeddings(rows, ngram_ids.shape[0], slot_offset)


class EngramQwenPinnedHostEmbedding(EngramStorage, Qwen4ExpPLEPinnedHostEmbedding):
    """Qwen4ExpPLEPinnedHostEmbedding (cpu_offload true, a GPU): the table in engram's exact-size host
    mapping (huge pages with use_thp), registered for UVA, read by vLLM's own UVA lookup."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _init_engram(self)
        super().__init__(*args, **kwargs)

    def allocate_embedding_weight(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self._engram is None:
            return super().allocate_embedding_weight(num_embeddings, embedding_dim, dtype)
        table = self._host_table(num_embeddings, embedding_dim, dtype)
        from engram.memory.registration import register
        from engram.ops.cuda import library_runtime

        register(self._mappings[-1], library_runtime())
        return table
