"""engram's settings inside vLLM: the `engram` section of `--additional-config` (or the JSON in
ENGRAM_VLLM_CONFIG), checked by engram's schema together with vLLM's own Engram fields, where vLLM checks
its own: when the engine config is created, before any worker starts."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from engram.config import VLLM_FIELDS, EngramConfig, load_config
from engram.config.loading import read_json_object
from engram.errors import EngramError
from engram.integrations.vllm import files
from engram.runtime.table import Group, Placement, ShardFormat, Table, open_table, placement_for, uva_runtime
from engram.validation.json_values import _describe

log = logging.getLogger("engram")

ENV = "ENGRAM_VLLM_CONFIG"


def section(vllm_config: Any) -> dict[str, Any] | None:
    """The engram section, or None when engram is not enabled for this model."""
    additional = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(additional, dict) and "engram" in additional:
        found = additional["engram"]
        where = "--additional-config's engram section"
    elif os.environ.get(ENV):
        return read_json_object(os.environ[ENV], ENV)  # bounded: depth, size, numbers; one ConfigError
    else:
        return None
    if not isinstance(found, dict):
        raise EngramError(f"{where} must be a JSON object of engram settings, got {_describe(found)}")
    return found


def engram_config(vllm_config: Any) -> EngramConfig | None:
    """The validated EngramConfig for the model vLLM is building (vLLM's four fields and engram's own), or
    None when engram is not enabled. A setting the plugin cannot honour is an error naming it."""
    found = section(vllm_config)
    if found is None:
        return None
    theirs = getattr(vllm_config, "engram_config", None)
    document = {name: getattr(theirs, name) for name in VLLM_FIELDS if hasattr(theirs, name)}  # this vLLM's fields
    clash = sorted(set(found) & set(VLLM_FIELDS))
    if clash:
        raise EngramError(
            f"engram setting {clash[0]!r} is vLLM's own: give it in --engram-config, not in engram's section"
        )
    config = load_config({**document, **found}, env={})
    if config.shard_layout != "vllm":
        raise EngramError(
            f"engram setting 'shard_layout': inside vLLM its own layout decides which rank holds which rows; {config.shard_layout!r} cannot be honoured there, leave it at 'vllm'"
        )
    if config.device_cache_bytes or config.ram_cache_bytes:
        from engram.integrations.vllm.cache import profile

        profile(config)  # read now: a missing or unreadable profile is an error before anything is allocated
    return config


def install_check(refusal: str | None = None) -> Callable[[], None]:
    """Check the section where vLLM checks its own Engram fields (VllmConfig's
    _resolve_and_verify_engram_config, in the process that parses the arguments), so a mistake fails
    `vllm serve` before any worker starts, as vLLM's own config errors do (once per process). With
    `refusal`, on a vLLM engram stands aside from, any engram section is that error. Returns the undo."""
    from vllm.config.vllm import VllmConfig

    theirs = VllmConfig._resolve_and_verify_engram_config
    if getattr(theirs, "engram_checks", False):
        return lambda: None

    def resolve_and_verify(vllm_config: Any) -> None:
        theirs(vllm_config)
        try:
            if refusal is None:
                engram_config(vllm_config)
            elif section(vllm_config) is not None:
                raise EngramError(refusal)
        except EngramError as exc:  # as a ValueError, pydantic shows it as vLLM's own config errors
            raise ValueError(f"engram: {exc}") from None

    resolve_and_verify.engram_checks = True  # type: ignore[attr-defined]
    VllmConfig._resolve_and_verify_engram_config = resolve_and_verify

    def undo() -> None:
        VllmConfig._resolve_and_verify_engram_config = theirs

    return undo


def placement(config: EngramConfig, family: str) -> Placement | None:
    """Where engram keeps a table of `family` ("deepseek" or "qwen") inside vLLM: the engine's rule
    (placement_for), or None where vLLM's layout leaves the table to vLLM: a device table on a GPU is
    vLLM's own tensor, read by vLLM's kernels. vLLM 0.33 gives Qwen4Exp's PLE tables no node-local group
    of replicas (0.34 neither), so there dp_shared_memory leaves each DP replica its own ETP shard."""
    on_gpu = torch.cuda.is_available()
    if on_gpu and not config.cpu_offload:
        return None
    if family == "qwen" and config.dp_shared_memory and config.cpu_offload and not config.file_backed:
        log.warning(
            "engram: dp_shared_memory applies to DeepSeek V4.1's Engram tables; vLLM gives Qwen4Exp's PLE "
            "tables no node-local group of replicas, so each DP replica keeps its own ETP shard (embedding_across_dp "
            "spreads one copy over the replicas instead)"
        )
    return placement_for(config, "cuda" if on_gpu else "cpu", shareable=family == "deepseek")


def open_vllm_table(
    config: EngramConfig,
    name: str,
    fmt: ShardFormat,
    placement: Placement,
    *,
    row_start: int,
    table_rows: int,
    model_dir: str | None = None,
    group: Group | None = None,
) -> Table:
    """A table vLLM's weight loaders fill (Table.weight_loader); with file_backed the pages of the
    checkpoint in `model_dir` (`name` its tensor's name), under that checkpoint's resident-set budget; with
    node_sharing the node's copy of it, attached or loaded from that checkpoint now (vLLM's loaders then
    copy nothing)."""
    checkpoint = budget = None
    if placement in ("file", "node"):
        if model_dir is None:
            raise EngramError(f"engram {files.setting(config)}: no checkpoint directory to serve {name} from")
        checkpoint = files.checkpoint(model_dir)
        budget = files.budget_for(model_dir, config.file_cache_bytes) if placement == "file" else None
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return open_table(
        name, fmt, placement, row_start=row_start, table_rows=table_rows, checkpoint=checkpoint, group=group,
        runtime=uva_runtime(), budget=budget, sharing=config.node_sharing, device=device,
    )  # fmt: skip
