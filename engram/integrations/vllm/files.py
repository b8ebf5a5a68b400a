"""The model's checkpoint inside vLLM (both families), which file-backed tables are served from and node
copies loaded from: its directory, opened once per process and shared by every table in it, the
checkpoint's name for the table a vLLM module holds, and with file_cache_bytes one resident-set budget per
checkpoint and process over the page cache of every file its tables read."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.runtime.table import Checkpoint, ResidentBudget

checkpoint = functools.cache(Checkpoint)  # one open checkpoint per directory and process


@functools.cache
def budget(path: str, budget_bytes: int) -> ResidentBudget:
    """The one budget (file_cache_bytes) of the checkpoint at `path` in this process, which every table
    served from it shares."""
    return ResidentBudget(budget_bytes)


def forget_checkpoints() -> None:
    """Drop this process's open checkpoints and budgets (each file's mapping goes with its last table view)."""
    checkpoint.cache_clear()
    budget.cache_clear()


def setting(config: EngramConfig) -> str:
    """The setting that makes engram read the checkpoint itself: file_backed, or node_sharing."""
    return "file_backed" if config.file_backed else "node_sharing"


def checkpoint_dir(vllm_config: Any, config: EngramConfig) -> str:
    """The model's local directory, whose safetensors files file-backed tables are served from and node
    copies loaded from."""
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    load = getattr(getattr(vllm_config, "load_config", None), "load_format", "auto")
    name = setting(config)
    if not isinstance(model, str) or not Path(model).is_dir():
        raise EngramError(
            f"engram setting {name!r} reads tables from the model's checkpoint files on local disk; {model!r} is not a directory (download the model first)"
        )
    if load == "dummy":
        raise EngramError(f"engram setting {name!r} reads the checkpoint's own tables; load_format 'dummy' has none")
    return model


def layer_tail(prefix: str) -> str:
    """A vLLM module prefix from `layers.` on: vLLM may map a checkpoint's `model.language_model.` to `model.`."""
    return prefix[prefix.find("layers.") :] if "layers." in prefix else prefix


def table_named(found: Checkpoint, prefix: str) -> str:
    """The checkpoint's name for the table a vLLM module under `prefix` holds: the one `<...>.weight` whose
    name ends as the prefix does from `layers.` on, or the one table written as `<...>.shard_0.weight` and
    on (vLLM's split_ngram_parts: file-backed tables are served from the parts, node copies load them)."""
    tail = layer_tail(prefix)
    whole = {n.removesuffix(".weight") for n in found.shapes if n.endswith(f"{tail}.weight")}
    first_part = f"{tail}.shard_0.weight"
    parts = {n.removesuffix(first_part) + tail for n in found.shapes if n.endswith(first_part)}
    names = sorted(whole | parts)
    if len(names) != 1:
        where = "none" if not names else f"{len(names)} ({', '.join(names[:3])})"
        raise EngramError(
            f"engram: the checkpoint should hold one table ending in {tail}.weight (or in {tail}.shard_<k>.weight parts) for vLLM's {prefix}, it holds {where}"
        )
    return names[0]
