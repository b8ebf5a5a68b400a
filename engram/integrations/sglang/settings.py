"""engram's settings inside SGLang: the `engram` section as JSON in ENGRAM_SGLANG_CONFIG (SGLang keeps its
own Engram settings in environment variables too, and has no additional_config), checked by engram's
schema together with SGLang's own Engram variables, in each process as its first table is built: before
any weight loads, a mistake one line naming the setting."""

from __future__ import annotations

import functools
import os

from engram.config import EngramConfig, engram_environment, load_config
from engram.config.loading import read_json_object
from engram.errors import EngramError
from engram.integrations.model_tables import model_directory, profile
from engram.integrations.sglang.rules import ENV, SGLANG_TABLE_SETTINGS, sglang_refusal


def engram_config() -> EngramConfig | None:
    """The validated EngramConfig from ENGRAM_SGLANG_CONFIG, or None when engram is not enabled. A setting
    the plugin cannot honour inside SGLang is an error naming it."""
    text = os.environ.get(ENV)
    if not text:
        return None
    sglang_settings = tuple(os.environ.get(name, "") for name in SGLANG_TABLE_SETTINGS)
    return _checked(text, sglang_settings, tuple(sorted(engram_environment(os.environ).items())))


@functools.cache
def _checked(text: str, sglang_settings: tuple[str, ...], environment: tuple[tuple[str, str], ...]) -> EngramConfig:
    """engram_config's answer for one value of the variables (every table of a process asks the same);
    `environment`: engram's own (engram_environment)."""
    config = load_config(read_json_object(text, ENV), env=dict(environment))
    refusal = sglang_refusal(config, dict(zip(SGLANG_TABLE_SETTINGS, sglang_settings, strict=True)))
    if refusal:
        raise EngramError(refusal)
    profile(config)  # read now: a missing or unreadable profile is an error before anything is allocated
    return config


def model_dir(config: EngramConfig) -> str:
    """The model's local directory, as SGLang's resolved model settings name it, for `config`'s tables
    read from the checkpoint (file_backed, node_sharing)."""
    from sglang.srt.runtime_context import get_model

    model = get_model()
    return model_directory(
        getattr(model, "model_path", None), config, dummy=getattr(model, "load_format", "auto") == "dummy"
    )
