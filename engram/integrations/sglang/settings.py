"""engram's settings inside SGLang: the `engram` section as JSON in ENGRAM_SGLANG_CONFIG (SGLang keeps its
own Engram settings in environment variables too, and has no additional_config), checked by engram's
schema together with SGLang's own Engram variables, in each process as its first table is built: before
any weight loads, a mistake one line naming the setting."""

from __future__ import annotations

import functools
import os

from engram.config import EngramConfig, load_config
from engram.config.loading import read_json_object
from engram.errors import EngramError
from engram.integrations.model_tables import model_directory, profile

ENV = "ENGRAM_SGLANG_CONFIG"
# SGLang's own ways of keeping DeepSeek V4.1's tables off the GPU: engram serves the tables instead.
SGLANG_TABLE_SETTINGS = ("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS")
TRUE = ("1", "true", "yes", "on")


def engram_config() -> EngramConfig | None:
    """The validated EngramConfig from ENGRAM_SGLANG_CONFIG, or None when engram is not enabled. A setting
    the plugin cannot honour inside SGLang is an error naming it."""
    text = os.environ.get(ENV)
    if not text:
        return None
    return _checked(text, tuple(os.environ.get(name, "") for name in SGLANG_TABLE_SETTINGS))


@functools.cache
def _checked(text: str, sglang_settings: tuple[str, ...]) -> EngramConfig:
    """engram_config's answer for one value of the variables (every table of a process asks the same)."""
    config = load_config(read_json_object(text, ENV), env={})
    for name, value in zip(SGLANG_TABLE_SETTINGS, sglang_settings, strict=True):
        if value.strip().lower() in TRUE:
            raise EngramError(
                f"{name}={value} asks SGLang to keep DeepSeek V4.1's tables itself, and {ENV} asks engram to: "
                f"unset {name}, or {ENV}"
            )
    refusals = {
        "dp_shared_memory": "SGLang gives engram no group of the node's replicas to share a copy in (node_sharing "
        "'node' shares one copy among every engine of the node)",
        "embedding_across_dp": "SGLang shards the tables over its TP ranks itself, whatever DP attention does",
    }
    for field, why in refusals.items():
        if getattr(config, field):
            raise EngramError(
                f"engram setting {field!r} cannot be honoured inside SGLang: {why}; leave it out of {ENV}"
            )
    if config.shard_layout != "vllm":
        raise EngramError(
            f"engram setting 'shard_layout': inside SGLang its own layout decides which rank holds which rows; "
            f"{config.shard_layout!r} cannot be honoured there, leave it out of {ENV}"
        )
    profile(config)  # read now: a missing or unreadable profile is an error before anything is allocated
    return config


def model_dir() -> str:
    """The model's local directory, as SGLang's resolved model settings name it."""
    from sglang.srt.runtime_context import get_model

    model = get_model()
    config = engram_config()
    assert config is not None
    return model_directory(
        getattr(model, "model_path", None), config, dummy=getattr(model, "load_format", "auto") == "dummy"
    )
