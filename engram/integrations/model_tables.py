"""A model's tables inside an engine, for every engine plugin (vLLM's, SGLang's): where a table lives (the
engine's rule), the model's checkpoint it is served or loaded from (opened once per process and
directory), the checkpoint's name for the table an engine module holds, and the tier of hot rows it gets.
The config's decisions (device, UVA runtime, the checkpoint's resident-set budget, node sharing, tiers)
are the table layer's TableOpener, one per config and checkpoint in a process, as engram's engine makes
them; a plugin adds only its engine's names and hooks."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.runtime.table import (
    Checkpoint,
    Group,
    Part,
    Placement,
    ShardFormat,
    Table,
    as_parameter,
    configured_profile,
)
from engram.runtime.table_opener import TableOpener, lookup_device

checkpoint = functools.cache(Checkpoint)  # one open checkpoint per directory and process
profile = functools.cache(configured_profile)  # one read per config: an engine builds an equal one per module


@functools.cache
def opener(config: EngramConfig, model_dir: str | None) -> TableOpener:
    """The one TableOpener in this process of `config` and the checkpoint at `model_dir` (None: tables the
    engine's loaders fill), whose resident-set budget (file_cache_bytes) every table served from it shares."""
    found = None if model_dir is None else checkpoint(model_dir)
    return TableOpener(config, checkpoint=found, profile=profile(config))


def forget_checkpoints() -> None:
    """Drop this process's open checkpoints and budgets (each file's mapping goes with its last table view)."""
    opener.cache_clear()
    checkpoint.cache_clear()


def reading_setting(config: EngramConfig) -> str:
    """The setting that makes engram read the checkpoint itself: file_backed, or node_sharing."""
    return "file_backed" if config.file_backed else "node_sharing"


def model_directory(model: object, config: EngramConfig, *, dummy: bool = False) -> str:
    """The model's local directory (`model`, as the engine names it), whose safetensors files file-backed
    tables are served from and node copies loaded from; `dummy`: the engine loads no weights."""
    name = reading_setting(config)
    if not isinstance(model, str) or not Path(model).is_dir():
        raise EngramError(
            f"engram setting {name!r} reads tables from the model's checkpoint files on local disk; {model!r} is not a directory (download the model first)"
        )
    if dummy:
        raise EngramError(f"engram setting {name!r} reads the checkpoint's own tables; load_format 'dummy' has none")
    return model


def layer_tail(prefix: str) -> str:
    """An engine's module prefix from `layers.` on: engines may map a checkpoint's `model.language_model.`
    to `model.`, or drop `model.`."""
    return prefix[prefix.find("layers.") :] if "layers." in prefix else prefix


def table_named(found: Checkpoint, prefix: str) -> str:
    """The checkpoint's name for the table an engine's module under `prefix` holds: the one `<...>.weight`
    whose name ends as the prefix does from `layers.` on, or the one table written as
    `<...>.shard_0.weight` and on (split_ngram_parts: file-backed tables are served from the parts, node
    copies load them)."""
    tail = layer_tail(prefix)
    whole = {n.removesuffix(".weight") for n in found.shapes if n.endswith(f"{tail}.weight")}
    first_part = f"{tail}.shard_0.weight"
    parts = {n.removesuffix(first_part) + tail for n in found.shapes if n.endswith(first_part)}
    names = sorted(whole | parts)
    if len(names) != 1:
        where = "none" if not names else f"{len(names)} ({', '.join(names[:3])})"
        raise EngramError(
            f"engram: the checkpoint should hold one table ending in {tail}.weight (or in {tail}.shard_<k>.weight parts) for the engine's {prefix}, it holds {where}"
        )
    return names[0]


def placement(config: EngramConfig, *, shareable: bool) -> Placement | None:
    """Where engram keeps an engine's table: the table layer's rule (TableOpener.placement), or None where
    the engine's layout leaves the table to the engine: a device table on a GPU is the engine's own tensor,
    read by its kernels. `shareable`: the engine gives the table a node-local group of replicas
    (dp_shared_memory)."""
    if lookup_device().type == "cuda" and not config.cpu_offload:
        return None
    return opener(config, None).placement(shareable=shareable)


def open_model_table(
    config: EngramConfig,
    model_dir: str | None,
    name: str,
    fmt: ShardFormat,
    where: Placement,
    *,
    row_start: int,
    table_rows: int,
    find: bool = False,
    group: Group | None = None,
) -> Table:
    """The table `name`, filled by the engine's weight loaders (Table.weight_loader). With file_backed it
    is the pages of the checkpoint in `model_dir`, under that checkpoint's resident-set budget; with
    node_sharing the node's copy of it, attached or loaded from that checkpoint now (the engine's loaders
    then copy nothing). `find`: `name` is the engine's module prefix, and the checkpoint's tensor is found
    by it (table_named)."""
    reads_checkpoint = where in ("file", "node")
    if reads_checkpoint and model_dir is None:
        raise EngramError(f"engram setting {reading_setting(config)!r} needs the model's checkpoint directory")
    tables = opener(config, model_dir if reads_checkpoint else None)
    if find and tables.checkpoint is not None:
        name = table_named(tables.checkpoint, name)
    return tables.table(name, fmt, where, row_start=row_start, table_rows=table_rows, group=group)


def give_tier(config: EngramConfig, name: str, table: Table, tables: int) -> None:
    """Give `table` (the rows this rank holds of the table the engine names `name`, one of the model's
    `tables`) its tier, when one is configured (TableOpener.give_tiers). The profile names tables as the
    checkpoint does, which an engine may prefix differently: its one table ending as `name` does from
    `layers.` on."""
    hot = profile(config)
    tail = layer_tail(name)
    found = [] if hot is None else [t for t in hot if t == name or t.endswith(tail)]
    if len(found) > 1:
        raise EngramError(
            f"the profile {config.device_cache_profile} holds {len(found)} tables ending in {tail} ({', '.join(found[:3])}); profile this model with `engram profile --out`"
        )
    key = found[0] if found else name
    opener(config, None).give_tiers([table], among=tables, key=lambda _: key)


def loaded_parameter(table: Table, part: Part) -> torch.nn.Parameter:
    """The parameter an engine's weight loader is handed for `part` of `table`, its weight_loader the
    table's: the table's own memory where that loader fills it (as_parameter: a stand-in of no memory for
    rows in pieces); over a file's pages or a node's sealed copy, loaded already and read-only (a write
    would fault), a stand-in of no memory of the same shape, which a write refuses."""
    held = table.weight if part == "weight" else table.scale
    assert held is not None
    if table.shard.placement in ("file", "node"):
        held = torch.zeros((1, held.shape[1]), dtype=held.dtype).expand(held.shape[0], held.shape[1])
    parameter = torch.nn.Parameter(as_parameter(held), requires_grad=False)
    parameter.weight_loader = table.weight_loader(part)  # type: ignore[attr-defined]
    return parameter
