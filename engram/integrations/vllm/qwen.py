"""Qwen4Exp's PLE tables in engram's storage, looked up by engram's gather: subclasses of vLLM 0.33's own
table classes (their constructors, quantisation methods and weight loaders stay vLLM's), swapped in by
name. Where engram is not enabled for the model every method is vLLM's own."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import vllm.models.qwen4_exp.common.ngram_embedding as vllm_ple
from vllm.config import get_current_vllm_config
from vllm.models.qwen4_exp.common.ngram_embedding import (
    Qwen4ExpPLEDeviceEmbedding,
    Qwen4ExpPLEFp8EmbeddingMethod,
    Qwen4ExpPLENvFp4EmbeddingMethod,
    Qwen4ExpPLEPinnedHostEmbedding,
)

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm import files
from engram.integrations.vllm.cache import hot_cache
from engram.integrations.vllm.settings import engram_config
from engram.memory.mapping import Mapping, map_anonymous
from engram.ops import gather, use_sorted
from engram.runtime.cache import HotRows, cached_gather
from engram.runtime.placement.hugepages import map_huge
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.placement.storage import ShardFormat, TableShard

log = logging.getLogger("engram")
UNQUANTIZED = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def _row_format(method: Any, dtype: torch.dtype) -> str:
    """engram's name for the rows vLLM's quantisation method stores (engram.ops.formats)."""
    if isinstance(method, Qwen4ExpPLENvFp4EmbeddingMethod):
        return "nvfp4"
    if isinstance(method, Qwen4ExpPLEFp8EmbeddingMethod):
        return "fp8-table"
    if dtype not in UNQUANTIZED:
        raise EngramError(f"engram file_backed: PLE tables stored as {dtype} are not an engram row format")
    return UNQUANTIZED[dtype]


class EngramStorage:
    """What the swapped classes add: tables in engram's mappings (exact size, huge pages with use_thp) or,
    with file_backed, views of the checkpoint's own pages; kept alive with the module, and rows gathered
    by engram's kernels."""

    _engram: EngramConfig | None
    _mappings: list[Mapping]
    _file: TableShard | None
    _budget: ResidentBudget | None  # file_cache_bytes, shared by the checkpoint's tables
    _cache: HotRows | None  # device_cache_bytes (host tables only): built on the first lookup
    _cache_built: bool
    _cacheable = False

    def _engram_table(self, rows: int, width: int, dtype: torch.dtype, uva: bool) -> torch.Tensor:
        """engram's storage for one of the table's row tensors (the rows, or NVFP4's block scales)."""
        assert self._engram is not None
        if self._engram.file_backed:
            return self._file_rows(rows, width, dtype, self._engram.file_cache_bytes)
        nbytes = max(1, rows * width * dtype.itemsize)
        mapping = map_huge(nbytes).mapping if self._engram.use_thp else map_anonymous(nbytes, kind="host")
        if uva:
            from engram.memory.registration import register
            from engram.ops.cuda import library_runtime

            register(mapping, library_runtime())
        self._mappings.append(mapping)
        return mapping.view(0, (rows, width), dtype)

    def _file_rows(self, rows: int, width: int, dtype: torch.dtype, cache_bytes: int) -> torch.Tensor:
        """This ETP rank's rows of a row tensor, in place in the checkpoint's file (mapped on first use, its
        page cache bounded by `cache_bytes`, file_cache_bytes)."""
        start = self.shard_indices.org_vocab_start_index  # type: ignore[attr-defined]
        if self._file is None:
            path = files.checkpoint_dir(get_current_vllm_config())
            table = files.table_named(files.checkpoint(path), self.prefix)  # type: ignore[attr-defined]
            fmt = ShardFormat(rows, self.embedding_dim, _row_format(self.quant_method, dtype))  # type: ignore[attr-defined]
            self._file = files.map_rows(path, table, fmt, start, self.org_vocab_size)  # type: ignore[attr-defined]
            self._budget = files.file_budget(path, cache_bytes, self._file)
        for part in (self._file.weight, self._file.scale):
            if part is not None and part.dtype == dtype and tuple(part.shape) == (rows, width):
                return part
        raise EngramError(
            f"engram file_backed: vLLM asks for {dtype} [{rows}, {width}] rows the checkpoint's {self._file.name} does not hold"
        )

    def _mark_file_backed(self) -> None:
        """Tell the weight loader which parameters are the checkpoint's own pages."""
        if self._file is None:
            return
        pointers = {p.data_ptr() for p in (self._file.weight, self._file.scale) if p is not None}
        for param in self.parameters():  # type: ignore[attr-defined]
            if param.data_ptr() in pointers:
                param.engram_file_backed = True

    def weight_loader(
        self, param: torch.nn.Parameter, loaded_weight: torch.Tensor, checkpoint_start: int | None = None
    ) -> None:
        """vLLM's, except for a file-backed table: its rows are the checkpoint's read-only pages, so nothing
        is copied (a write would fault); the shape is still checked."""
        if not getattr(param, "engram_file_backed", False):
            super().weight_loader(param, loaded_weight, checkpoint_start)  # type: ignore[misc]
            return
        whole = (self.org_vocab_size, *param.shape[1:])  # type: ignore[attr-defined]
        if checkpoint_start not in (None, 0) or tuple(loaded_weight.shape) != whole:
            raise EngramError(
                f"engram file-backed table: the checkpoint's {list(loaded_weight.shape)} rows from {checkpoint_start or 0} are not the whole table {list(whole)}"
            )

    def _engram_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows for global ids [T, H] (zeros for rows other ETP ranks own), as vLLM's
        quantisation method returns them: stored rows (fp8 stays fp8), NVFP4 dequantised; a file-backed
        table's by guarded host reads (files.staged_rows) unless a GPU reads the file over UVA."""
        if self._file is not None and (not ids.is_cuda or files.staged(self._file)):
            return files.staged_rows(self._file, ids, self._gather, self._budget)
        return self._gather(ids)  # a GPU reads an in-memory file over UVA, pinned: no guard needed

    def _gather(self, ids: torch.Tensor) -> torch.Tensor:
        """engram's gather on ids' device (a GPU reads a host table over UVA), sorted and deduplicated
        where that pays (ops.use_sorted)."""
        method = self.embedding_method  # type: ignore[attr-defined]
        start = self.shard_indices.org_vocab_start_index  # type: ignore[attr-defined]
        table_rows = self.num_embeddings_padded  # type: ignore[attr-defined]
        weight = self.weight.data  # type: ignore[attr-defined]
        dedup = use_sorted(ids.numel(), weight, ids.device)
        scale, table_scale, out_dtype = None, None, weight.dtype
        if isinstance(method, Qwen4ExpPLENvFp4EmbeddingMethod):
            scale = self.weight_scale.data  # type: ignore[attr-defined]
            table_scale = float(self.weight_scale_2.data.reshape(-1)[0])  # type: ignore[attr-defined]
            out_dtype = self.params_dtype  # type: ignore[attr-defined]
        cache = self._hot_rows(scale)
        if cache is not None:
            return cached_gather(cache, weight, scale, ids, start, table_rows, out_dtype, dedup, None, table_scale)
        return gather(weight, scale, ids, start, table_rows, out_dtype, dedup, table_scale=table_scale)

    def _hot_rows(self, scale: torch.Tensor | None) -> HotRows | None:
        """This rank's device cache of a host table (device_cache_bytes), built on the first lookup."""
        if not self._cache_built and self._cacheable:
            weight = self.weight.data  # type: ignore[attr-defined]
            fmt = ShardFormat(weight.shape[0], self.embedding_dim, _row_format(self.quant_method, weight.dtype))  # type: ignore[attr-defined]
            start = self.shard_indices.org_vocab_start_index  # type: ignore[attr-defined]
            shard = self._file or TableShard(self.prefix, start, fmt, "pinned", weight, scale)  # type: ignore[attr-defined]
            self._cache = hot_cache(self._engram, self.prefix, shard)  # type: ignore[attr-defined]
        self._cache_built = True
        return self._cache


def _init_engram(module: Any, pinned: bool) -> None:
    config = engram_config(get_current_vllm_config())
    if config is not None and pinned and config.dp_shared_memory:
        log.warning(
            "engram: dp_shared_memory applies to DeepSeek V4.1's Engram tables; vLLM 0.33 gives Qwen4Exp's PLE "
            "tables no node-local group of replicas, so each DP replica keeps its own ETP shard (embedding_across_dp "
            "spreads one copy over the replicas instead)"
        )
    module._engram = config
    module._mappings = []
    module._file = None
    module._budget = None
    module._cache = None
    module._cache_built = False


class EngramQwenDeviceEmbedding(EngramStorage, Qwen4ExpPLEDeviceEmbedding):
    """Qwen4ExpPLEDeviceEmbedding (cpu_offload false). On vLLM's CPU platform engram keeps the table in a
    mapping of its own and gathers with its CPU kernels; on a GPU the table stays vLLM's device tensor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _init_engram(self, pinned=False)
        super().__init__(*args, **kwargs)
        self._mark_file_backed()

    def allocate_embedding_weight(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self._engram is None or torch.cuda.is_available():
            return super().allocate_embedding_weight(num_embeddings, embedding_dim, dtype)
        return self._engram_table(num_embeddings, embedding_dim, dtype, uva=False)

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


@contextlib.contextmanager
def _host_views_of_staged(module: EngramStorage) -> Iterator[None]:
    """While vLLM's constructor runs: its accelerator view of a staged file-backed table (a file the GPU
    cannot read) is the host tensor itself, never read by a GPU kernel (engram's _lookup serves it)."""
    theirs = vllm_ple.get_accelerator_view_from_cpu_tensor

    def view(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if files.staged(module._file) else theirs(tensor)

    vllm_ple.get_accelerator_view_from_cpu_tensor = view
    try:
        yield
    finally:
        vllm_ple.get_accelerator_view_from_cpu_tensor = theirs


class EngramQwenPinnedHostEmbedding(EngramStorage, Qwen4ExpPLEPinnedHostEmbedding):
    """Qwen4ExpPLEPinnedHostEmbedding (cpu_offload true): the table in engram's exact-size host mapping
    (huge pages with use_thp) registered for UVA, or with file_backed the checkpoint's own pages. Every
    lookup vLLM makes (its prefetch hook on the side stream, and sync_lookup) is engram's gather: on a GPU
    its CUDA kernel over UVA, sorted where that pays; for a file the GPU cannot read, host threads and one
    copy. With device_cache_bytes the profile's hot rows of it are kept on the GPU."""

    _cacheable = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _init_engram(self, pinned=True)
        with _host_views_of_staged(self):
            super().__init__(*args, **kwargs)
        self._mark_file_backed()

    def allocate_embedding_weight(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self._engram is None:
            return super().allocate_embedding_weight(num_embeddings, embedding_dim, dtype)
        return self._engram_table(num_embeddings, embedding_dim, dtype, uva=torch.cuda.is_available())

    def _lookup(self, input_ids: torch.Tensor, output: torch.Tensor | None = None) -> torch.Tensor:
        if self._engram is None:
            return super()._lookup(input_ids, output)
        rows = self._engram_rows(input_ids)
        return rows if output is None else output.copy_(rows)
