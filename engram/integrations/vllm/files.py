"""File-backed tables inside vLLM (both families): the model's checkpoint directory, opened once per process
and shared by every table in it, each table a view of the checkpoint's own read-only pages. On a GPU a file
on tmpfs or hugetlbfs is registered read-only so vLLM's kernels read it over UVA; any other file is
`staged`: host threads gather its rows (guarded, so a file that shrank is named, never SIGBUS) and one copy
takes them to the GPU. With file_cache_bytes, one resident-set budget per checkpoint and process bounds the
page cache of every file its tables are read from, as in engram's own engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engram.errors import EngramError
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.filemap import file_shard, reading, watch_files
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.placement.storage import ShardFormat, TableShard

_CHECKPOINTS: dict[str, Checkpoint] = {}  # one open checkpoint per directory and process
_BUDGETS: dict[tuple[str, int], ResidentBudget] = {}  # file_cache_bytes: one per checkpoint and bound


def checkpoint_dir(vllm_config: Any) -> str:
    """The model's local directory, whose safetensors files file-backed tables are served from."""
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    load = getattr(getattr(vllm_config, "load_config", None), "load_format", "auto")
    if not isinstance(model, str) or not Path(model).is_dir():
        raise EngramError(
            f"engram setting 'file_backed' serves tables from the model's safetensors files on local disk; {model!r} is not a directory (download the model first)"
        )
    if load == "dummy":
        raise EngramError(
            "engram setting 'file_backed' serves the checkpoint's own pages; load_format 'dummy' has none"
        )
    return model


def checkpoint(path: str) -> Checkpoint:
    if path not in _CHECKPOINTS:
        _CHECKPOINTS[path] = Checkpoint(path)
    return _CHECKPOINTS[path]


def forget_checkpoints() -> None:
    """Drop this process's open checkpoints (each file's mapping goes with its last table view)."""
    _CHECKPOINTS.clear()
    _BUDGETS.clear()


def layer_tail(prefix: str) -> str:
    """A vLLM module prefix from `layers.` on: vLLM may map a checkpoint's `model.language_model.` to `model.`."""
    return prefix[prefix.find("layers.") :] if "layers." in prefix else prefix


def table_named(found: Checkpoint, prefix: str) -> str:
    """The checkpoint's name for the table a vLLM module under `prefix` holds: the one `<...>.weight` whose
    name ends as the prefix does from `layers.` on."""
    tail = layer_tail(prefix)
    names = sorted(n.removesuffix(".weight") for n in found.shapes if n.endswith(f"{tail}.weight"))
    if not names and any(f"{tail}.shard_" in n for n in found.shapes):
        raise EngramError(
            f"file_backed tables are served from one tensor per table, but {tail} is split into shard_<k> parts; set file_backed to false, or write the table whole"
        )
    if len(names) != 1:
        where = "none" if not names else f"{len(names)} ({', '.join(names[:3])})"
        raise EngramError(
            f"engram file_backed: the checkpoint should hold one table ending in {tail}.weight for vLLM's {prefix}, it holds {where}"
        )
    return names[0]


def map_rows(path: str, table: str, fmt: ShardFormat, row_start: int, table_rows: int) -> TableShard:
    """Rows [row_start, row_start + fmt.rows) of `table`, in place in the checkpoint at `path`; registered
    read-only for UVA where the GPU can read the file."""
    runtime = None
    if torch.cuda.is_available():
        from engram.ops.cuda import library_runtime

        runtime = library_runtime()
    return file_shard(table, fmt, row_start, table_rows, checkpoint(path), runtime)


def staged(shard: TableShard | None) -> bool:
    """A file-backed table whose rows a GPU gathers through host threads (its file is not UVA-readable)."""
    return shard is not None and shard.device_pointer is None


def file_budget(path: str, budget_bytes: int, shard: TableShard) -> ResidentBudget | None:
    """file_cache_bytes (None for 0, no bound): the budget of the checkpoint at `path` in this process,
    now bounding `shard`'s files too; every table served from the checkpoint shares it."""
    if not budget_bytes:
        return None
    budget = _BUDGETS.setdefault((path, budget_bytes), ResidentBudget(budget_bytes))
    watch_files(budget, shard)
    return budget


def staged_rows(
    shard: TableShard,
    ids: torch.Tensor,
    rows: Callable[[torch.Tensor], torch.Tensor],
    budget: ResidentBudget | None = None,
) -> torch.Tensor:
    """rows(ids) gathered on the host from a file-backed shard, on ids' device (one copy when it is a GPU);
    `budget` (file_cache_bytes) is told what the reads may have added to the page cache."""
    host_ids = ids.cpu()
    with reading(shard, host_ids, budget):
        out = rows(host_ids)
    return out if not ids.is_cuda else out.pin_memory().to(ids.device, non_blocking=True)
