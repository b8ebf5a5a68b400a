"""What engram cannot honour inside SGLang, as a rule on a valid config and SGLang's own Engram variables:
the plugin applies it to ENGRAM_SGLANG_CONFIG, and `engram validate` and `engram plan --engine sglang` to
a deployment. Without torch: the commands that ask it start without it."""

from __future__ import annotations

from collections.abc import Mapping

from engram.config import EngramConfig

ENV = "ENGRAM_SGLANG_CONFIG"
# SGLang's own ways of keeping DeepSeek V4.1's tables off the GPU: engram serves the tables instead.
SGLANG_TABLE_SETTINGS = ("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS")
TRUE = ("1", "true", "yes", "on")


REFUSED = {
    "dp_shared_memory": "SGLang gives engram no group of the node's replicas to share a copy in (node_sharing "
    "'node' shares one copy among every engine of the node)",
    "embedding_across_dp": "SGLang shards the tables over its TP ranks itself, whatever DP attention does",
}


def sglang_refusal(config: EngramConfig, sglang_settings: Mapping[str, str]) -> str | None:
    """Why a valid engram config cannot be served inside SGLang beside SGLang's own Engram variables
    `sglang_settings` (the environment), or None: engram validate and plan ask it too."""
    for name in SGLANG_TABLE_SETTINGS:
        value = sglang_settings.get(name, "")
        if value.strip().lower() in TRUE:
            return (
                f"{name}={value} asks SGLang to keep DeepSeek V4.1's tables itself, and {ENV} asks engram to: "
                f"unset {name}, or {ENV}"
            )
    for field, why in REFUSED.items():
        if getattr(config, field):
            return f"engram setting {field!r} cannot be honoured inside SGLang: {why}; leave it out of {ENV}"
    if config.shard_layout != "vllm":
        return (
            f"engram setting 'shard_layout': inside SGLang its own layout decides which rank holds which rows; "
            f"{config.shard_layout!r} cannot be honoured there, leave it out of {ENV}"
        )
    return None
