"""The model's checkpoint directory as vLLM names it (both families): file-backed tables are served from
it and node copies loaded from it (engram.integrations.model_tables opens it, once per process)."""

from __future__ import annotations

from typing import Any

from engram.config import EngramConfig
from engram.integrations.model_tables import model_directory


def checkpoint_dir(vllm_config: Any, config: EngramConfig) -> str:
    """The model's local directory, whose safetensors files file-backed tables are served from and node
    copies loaded from."""
    model = getattr(getattr(vllm_config, "model_config", None), "model", None)
    load = getattr(getattr(vllm_config, "load_config", None), "load_format", "auto")
    return model_directory(model, config, dummy=load == "dummy")
