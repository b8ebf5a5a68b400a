"""engram's settings inside vLLM: the `engram` section of `--additional-config` (or the JSON in
ENGRAM_VLLM_CONFIG), checked by engram's schema together with vLLM's own Engram fields, where vLLM checks
its own: when the engine config is created, before any worker starts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from engram.config import VLLM_FIELDS, EngramConfig, engram_environment, load_config
from engram.config.loading import read_json_object
from engram.errors import EngramError
from engram.integrations.model_tables import profile
from engram.validation.json_values import _describe

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
    config = load_config({**document, **found}, env=engram_environment(os.environ))
    if config.shard_layout != "vllm":
        raise EngramError(
            f"engram setting 'shard_layout': inside vLLM its own layout decides which rank holds which rows; {config.shard_layout!r} cannot be honoured there, leave it at 'vllm'"
        )
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
