"""engram: Engram / PLE n-gram embedding tables for LLM serving.

The names a user needs: the configuration (load_config and its types, the errors), the model presets
(get_preset, ModelSpec), and the tables (EngramTables, init_from_env). Each is imported on first use, so
that `import engram` costs nothing and the configuration commands start without torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engram.apps.presets import get_preset
    from engram.config import (
        Deployment,
        EngramConfig,
        LoadConfig,
        ModelConfig,
        ParallelConfig,
        load_config,
        load_deployment,
        validate_deployment,
    )
    from engram.errors import ConfigError, EngramError, Problem
    from engram.ngram.spec import ModelSpec
    from engram.runtime.engine import EngramTables, init_from_env

_CONFIG = (
    "Deployment",
    "EngramConfig",
    "LoadConfig",
    "ModelConfig",
    "ParallelConfig",
    "load_config",
    "load_deployment",
)
_LAZY = {
    **dict.fromkeys((*_CONFIG, "validate_deployment"), "engram.config"),
    **dict.fromkeys(("ConfigError", "EngramError", "Problem"), "engram.errors"),
    "get_preset": "engram.apps.presets",
    "ModelSpec": "engram.ngram.spec",
    "EngramTables": "engram.runtime.engine",
    "init_from_env": "engram.runtime.engine",
}

__all__ = [
    "ConfigError",
    "Deployment",
    "EngramConfig",
    "EngramError",
    "EngramTables",
    "LoadConfig",
    "ModelConfig",
    "ModelSpec",
    "ParallelConfig",
    "Problem",
    "get_preset",
    "init_from_env",
    "load_config",
    "load_deployment",
    "validate_deployment",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engram' has no attribute {name!r}")
