"""The Engram configuration: one validated EngramConfig (and the deployment around it) from a dict, JSON
text or bytes, a file, the environment and the command line; ConfigError lists every problem."""

from engram.config.loading import (
    PARTS,
    ConfigError,
    Deployment,
    EngramConfig,
    HostLimits,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    Problem,
    add_deployment_args,
    add_engram_args,
    checked_parts,
    document_from_args,
    load_config,
    load_deployment,
    read_deployment,
    validate_deployment,
    verify_host_memory,
)

__all__ = [
    "PARTS",
    "ConfigError",
    "Deployment",
    "EngramConfig",
    "HostLimits",
    "LoadConfig",
    "ModelConfig",
    "ParallelConfig",
    "Problem",
    "add_deployment_args",
    "add_engram_args",
    "checked_parts",
    "document_from_args",
    "load_config",
    "load_deployment",
    "read_deployment",
    "validate_deployment",
    "verify_host_memory",
]
