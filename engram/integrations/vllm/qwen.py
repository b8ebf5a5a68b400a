"""Qwen4Exp's PLE tables served by engram's table layer: subclasses of vLLM's own table classes (their
constructors, quantisation methods and collectives stay vLLM's), swapped in by name (swaps). Where engram
is not enabled for the model every method is vLLM's own. vLLM 0.32 has no NVFP4 PLE tables; 0.34's
disk-offload table is served by engram where vLLM has it (qwen_disk)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import vllm.models.qwen4_exp.common.ngram_embedding as vllm_ple
from vllm.config import get_current_vllm_config

# Imported by name, not read off the module when used: a vLLM without one of them fails this import, so the
# plugin stands aside whole (register) rather than serving with a class missing.
from vllm.models.qwen4_exp.common.ngram_embedding import (
    Qwen4ExpPLEDeviceEmbedding,
    Qwen4ExpPLEFp8EmbeddingMethod,
    Qwen4ExpPLEPinnedHostEmbedding,
)

from engram.errors import EngramError
from engram.integrations.vllm.settings import engram_config
from engram.integrations.vllm.tables import Served, open_for, placement
from engram.runtime.table import Part, Placement, ShardFormat, Table, as_parameter

UNQUANTIZED = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
NVFP4_METHOD = getattr(vllm_ple, "Qwen4ExpPLENvFp4EmbeddingMethod", None)  # vLLM 0.33 and newer


def row_format(method: Any, dtype: torch.dtype) -> str:
    """engram's name for the rows vLLM's quantisation method stores (engram.ops.formats)."""
    if NVFP4_METHOD is not None and isinstance(method, NVFP4_METHOD):
        return "nvfp4"
    if isinstance(method, Qwen4ExpPLEFp8EmbeddingMethod):
        return "fp8-table"
    if dtype == torch.uint8 and NVFP4_METHOD is None:
        raise EngramError(
            "engram: PLE tables stored as uint8 are NVFP4, which this vLLM (0.32) has no PLE method for; use vLLM 0.33 or newer"
        )
    if dtype not in UNQUANTIZED:
        raise EngramError(f"engram: PLE tables stored as {dtype} are not an engram row format")
    return UNQUANTIZED[dtype]


# vLLM's table classes, Any to the type checker (vLLM is not installed beside engram): the mixin reads their
# attributes (shard_indices, quant_method, embedding_dim, prefix, weight, ...), set by their constructors.
_VllmTable: Any = object


class EngramStorage(_VllmTable):
    """What the swapped classes add: vLLM's ETP shard of the table (org_vocab_start_index on: a row range)
    served by engram's table layer, placed as engram's engine places it, filled by the table's loaders, and
    looked up by it (tables.Served). Kept alive with the module."""

    _host_table = False  # cpu_offload's class: engram's on a GPU too, and given a tier of hot rows
    engram_table: Table | None
    _served: Served | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init_engram(self)
        super().__init__(*args, **kwargs)

    def _engram_part(self, rows: int, width: int, dtype: torch.dtype) -> torch.Tensor:
        """engram's storage for one of the table's row tensors vLLM asks for (the rows, or NVFP4's block
        scales), the table opened on the first."""
        table = self.engram_table
        if table is None:
            where = placement(self._engram, "qwen")
            assert where is not None  # a GPU's device table is vLLM's: the classes never get here
            fmt = ShardFormat(rows, self.embedding_dim, row_format(self.quant_method, dtype))
            vocabulary = where in ("file", "node")  # the checkpoint's tensor, of the vocabulary's rows
            table = open_engram_table(
                self, fmt, where, row_start=self.shard_indices.org_vocab_start_index,
                table_rows=self.org_vocab_size if vocabulary else self.num_embeddings_padded, tiered=self._host_table,
            ).table  # fmt: skip
        for part, rows_of in (("weight", table.weight), ("scale", table.scale)):
            if rows_of is not None and rows_of.dtype == dtype and tuple(rows_of.shape) == (rows, width):
                param = as_parameter(rows_of)  # rows in pieces of the checkpoint's parts: a stand-in of no memory
                self._engram_params[param.data_ptr()] = part
                return param
        raise EngramError(f"engram: vLLM asks for {dtype} [{rows}, {width}] rows the table {table.name} does not hold")

    def allocate_embedding_weight(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype) -> torch.Tensor:
        if self._engram is None or (torch.cuda.is_available() and not self._host_table):  # a GPU's device table: vLLM's
            return super().allocate_embedding_weight(num_embeddings, embedding_dim, dtype)
        return self._engram_part(num_embeddings, embedding_dim, dtype)

    def weight_loader(
        self, param: torch.nn.Parameter, loaded_weight: torch.Tensor, checkpoint_start: int | None = None
    ) -> None:
        part = self._engram_params.get(param.data_ptr())
        load_weight(self, part, param, loaded_weight, checkpoint_start, super().weight_loader)

    def _engram_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """This rank's rows for global ids [T, H] (zeros for rows other ETP ranks own), as vLLM's
        quantisation method returns them (lookup_dtype: stored rows, fp8 staying fp8, NVFP4 dequantised)."""
        assert self._served is not None
        method = self.embedding_method  # 0.32's has no lookup_dtype: its lookups return the rows as stored
        return self._served.lookup(
            ids, method.lookup_dtype(self) if hasattr(method, "lookup_dtype") else self.weight.dtype
        )


def open_engram_table(
    module: Any, fmt: ShardFormat, where: Placement, *, row_start: int, table_rows: int, tiered: bool
) -> Served:
    """The module's engram table (tables.open_for, vLLM's name for it found in the checkpoint) and the
    Served its lookups go through, given its tier on the first lookup where `tiered`: the one way every
    Qwen4Exp class opens its table."""
    config = module._engram
    table = open_for(
        config, get_current_vllm_config(), module.prefix, fmt, where, find=True, row_start=row_start,
        table_rows=table_rows,
    )  # fmt: skip
    module.engram_table, module._served = table, Served(config, module.prefix, table, module._tables, tiered=tiered)
    return module._served


def load_weight(
    module: Any,
    part: Part | None,
    param: torch.Tensor,
    loaded_weight: torch.Tensor,
    checkpoint_start: int | None,
    theirs: Callable[..., None],
) -> None:
    """The one weight loader of the Qwen4Exp classes engram serves: a parameter that is the table's `part`
    goes to the table's loader (Table.weight_loader; a file-backed table's checks the rows' width and copies
    nothing, its rows being the checkpoint's read-only pages); any other parameter to vLLM's loader
    (`theirs`), and the table scale then reaches the table too."""
    table = module.engram_table
    if table is None or part is None:
        theirs(param, loaded_weight, checkpoint_start)
    else:
        table.weight_loader(part)(param, loaded_weight, checkpoint_start)
    if table is None or table.table_scale is None:
        return
    if param is getattr(module, table.shard.format.row_format.table_scale_name, None):  # it reaches the table too
        table.weight_loader("table_scale")(table.table_scale, loaded_weight)


def init_engram(module: Any) -> None:
    """engram's state on one of vLLM's Qwen4Exp table modules, before vLLM's constructor runs: its config
    (None where engram is not enabled: every method is then vLLM's), and the model's PLE tables, over which
    a tier's budget is split."""
    vllm_config = get_current_vllm_config()
    module._engram = engram_config(vllm_config)
    text_config = getattr(getattr(vllm_config, "model_config", None), "hf_text_config", None)
    module._tables = len(getattr(text_config, "ple_layer_ids", None) or [1])
    module.engram_table = module._served = None
    module._engram_params = {}  # the tensors handed to vLLM as the table's parameters, by address -> Part


class EngramQwenDeviceEmbedding(EngramStorage, Qwen4ExpPLEDeviceEmbedding):
    """Qwen4ExpPLEDeviceEmbedding (cpu_offload false). On vLLM's CPU platform engram keeps the table in a
    mapping of its own and gathers with its CPU kernels; on a GPU the table stays vLLM's device tensor."""

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
        return tensor if module.engram_table is not None and module.engram_table.shard.staged else theirs(tensor)

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

    _host_table = True
    _host_rows: torch.Tensor | None = None  # a CPU step's rows, from start_prefetch to finalize_prefetch

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        with _host_views_of_staged(self):
            super().__init__(*args, **kwargs)

    def _lookup(self, input_ids: torch.Tensor, output: torch.Tensor | None = None) -> torch.Tensor:
        if self._engram is None:
            return super()._lookup(input_ids, output)
        rows = self._engram_rows(input_ids)
        return rows if output is None else output.copy_(rows)

    def start_prefetch(self, ngram_ids: torch.Tensor) -> None:
        """vLLM reads the step's rows on a side stream; a CPU (vLLM's CPU platform) has none, so engram reads
        them now, as that stream would (this DP group's ids gathered), and finalize_prefetch hands them over."""
        if self._engram is None or ngram_ids.is_cuda:
            super().start_prefetch(ngram_ids)
            return
        slot_size, _ = self._get_dp_gather_slot(ngram_ids.shape[0])
        self._host_rows = self._lookup(self._gather_dp_ids(ngram_ids, slot_size))

    def finalize_prefetch(self, total_tokens: int) -> torch.Tensor:
        """vLLM's _finalize_prefetch on the rows start_prefetch read on the CPU: the ETP reduction where it
        reduces, and this DP rank's rows, [total_tokens, heads * dim]."""
        rows = self._host_rows
        if self._engram is None or rows is None:
            return super().finalize_prefetch(total_tokens)
        self._host_rows = None
        slot_size, slot_offset = self._get_dp_gather_slot(total_tokens)
        rows = rows[: slot_size * self.etp_data_parallel_size]
        if self.reduce_results:
            rows = self._reduce_etp_embeddings(rows)
        return self._select_embeddings(rows, total_tokens, slot_offset).flatten(-2)
