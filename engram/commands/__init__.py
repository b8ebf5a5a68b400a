"""Subcommands of `engram`. Each module's register(subparsers) adds its commands (add_command) and sets
`run` on each. COMMANDS names every command's module and summary, so that the command line imports only
the module of the command it runs: validate, hash, schema and docs start without torch."""

from __future__ import annotations

import argparse
import math
from typing import Any

# command -> (module in engram.commands, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "validate": ("validate", "check a deployment document and flags against every Engram rule"),
    "hash": ("hash", "print the EngramConfig digest of a vLLM version (its compile_factors or compute_hash)"),
    "schema": ("schema_docs", "print the JSON Schema of a deployment document"),
    "docs": ("schema_docs", "print the Markdown configuration reference"),
    "ngram": ("ngram", "n-gram row ids of a text or of token ids"),
    "layout": ("ngram", "rows, bytes, primes and offsets of a preset's tables"),
    "check-checkpoint": ("checkpoint", "validate a checkpoint's files (headers, ranges, CRCs) without loading tables"),
    "make-checkpoint": ("checkpoint", "write a synthetic checkpoint in the real tensor naming"),
    "plan": ("plan", "bytes per rank and node, and collectives per step, of a deployment"),
    "doctor": ("doctor", "check shm, huge pages, memlock, memory, CUDA and nvcc (against a plan with --preset)"),
    "demo": ("demo", "replicas sharing one copy of the tables, lookups checked against a reference"),
    "profile": ("profile", "Zipf profile of a preset's n-gram ids on real text, and cache hit rates"),
    "node-agent": ("node_agent", "hold the node copies every engine's pod asks for (node_dir), one per node"),
}


def add_command(subparsers: Any, name: str) -> argparse.ArgumentParser:
    """The parser of command `name`, with its summary from COMMANDS."""
    summary = COMMANDS[name][1]
    parser: argparse.ArgumentParser = subparsers.add_parser(name, help=summary, description=summary)
    return parser


def positive_number(text: str) -> float:
    """An argparse type: a finite number above zero (nan, inf, 0 and below are refused by name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:50]!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text[:50]!r} must be a finite number above 0")
    return value


ENGINES = ("vllm", "sglang")


def add_engine_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="vllm",
        help="the engine the deployment runs in: vllm (the default), or sglang (engram's section in "
        "ENGRAM_SGLANG_CONFIG, checked with SGLang's own Engram variables in this environment)",
    )


def engine_config(engine: str, deployment: Any) -> Any:
    """A valid deployment's engram config as `engine` takes it, or the error naming what it cannot honour
    (SGLang's rules). Inside SGLang a null dp_shared_memory stays off: vLLM's rule, which resolves it, is
    not SGLang's."""
    if engine != "sglang":
        return deployment.engram
    import os

    import msgspec

    from engram.errors import ConfigError, Problem
    from engram.integrations.sglang.rules import sglang_refusal

    config = msgspec.structs.replace(deployment.engram, dp_shared_memory=bool(deployment.dp_shared_memory_given))
    refusal = sglang_refusal(config, os.environ)
    if refusal:
        raise ConfigError([Problem("/engram", "sglang-cannot-serve", refusal)])
    return config
