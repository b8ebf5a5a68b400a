"""`engram validate`: check a deployment before anything is loaded. Its inputs (a document, flags) are read
here for `engram hash` too."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from engram.commands import add_command, add_engine_arg, engine_config
from engram.config import (
    PARTS,
    Deployment,
    add_deployment_args,
    add_engram_args,
    checked_parts,
    document_from_args,
    dp_shared_memory_resolution,
    validate_deployment,
)
from engram.config.loading import MAX_DOCUMENT_BYTES
from engram.errors import ConfigError, EngramError, Problem


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "validate")
    add_deployment_inputs(parser)
    add_engine_arg(parser)
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(run=run_validate)


def add_deployment_inputs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("document", nargs="?", metavar="DEPLOYMENT.json", help="deployment document; '-' reads stdin")
    add_engram_args(parser)
    add_deployment_args(parser)


def read_document(args: argparse.Namespace) -> dict[str, Any]:
    """The positional document (a path, or '-' for stdin) with the flags applied."""
    source: Any = args.document
    if source == "-":
        source = _stdin()
    return document_from_args(args, source)


def _stdin() -> bytes:
    """Standard input, at most MAX_DOCUMENT_BYTES of it (`- </dev/zero` is refused, not read forever)."""
    stream = getattr(sys.stdin, "buffer", None)
    if stream is None:
        raise EngramError("'-' reads the document from standard input, which is closed; give a file or pipe one in")
    try:
        data = stream.read(MAX_DOCUMENT_BYTES + 1)
    except (OSError, ValueError) as exc:
        raise EngramError(
            f"cannot read the document from standard input: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise EngramError(
            f"standard input holds more than {MAX_DOCUMENT_BYTES:,} bytes; a deployment document is smaller"
        )
    return bytes(data)


def deployment_from_args(args: argparse.Namespace) -> Deployment:
    return validate_deployment(read_document(args))


def run_validate(args: argparse.Namespace) -> int:
    checked: list[str] = []
    try:
        document = read_document(args)
        checked = checked_parts(document)
        deployment = validate_deployment(document)
        config = engine_config(args.engine, deployment)
    except ConfigError as exc:
        if not args.json:
            raise
        _print_json(valid=False, checked=checked, errors=exc.errors)
        return 2
    if args.json:
        _print_json(valid=True, checked=deployment.checked, deployment=deployment, config=config)
        return 0
    unchecked = [p for p in PARTS if p not in deployment.checked]
    print(
        f"valid: {', '.join(deployment.checked)} checked"
        + (f"; not given, not checked: {', '.join(unchecked)}" if unchecked else "")
    )
    print("engram: " + " ".join(f"{k}={json.dumps(v)}" for k, v in msgspec.to_builtins(config).items()))
    if args.engine == "sglang":  # SGLang shards over its TP ranks and keeps no EngramConfig digest
        print("engine: SGLang 0.5.23 (give the engram section in ENGRAM_SGLANG_CONFIG)")
        return 0
    resolution = dp_shared_memory_resolution(deployment.dp_shared_memory_given, deployment.engram.dp_shared_memory)
    if resolution:
        print(resolution)
    if deployment.parallel_size is not None:
        print(f"embedding group size: {deployment.parallel_size}")
    print(f"hash: {deployment.engram.compute_hash()}  ({deployment.engram.digest_name()})")
    return 0


def _print_json(
    *,
    valid: bool,
    checked: list[str],
    deployment: Deployment | None = None,
    config: Any = None,
    errors: list[Problem] | None = None,
) -> None:
    result = {
        "valid": valid,
        "checked": checked,
        "engram": msgspec.to_builtins(config) if deployment else None,
        "hash": deployment.engram.compute_hash() if deployment else None,
        "hash_of": deployment.engram.digest_name() if deployment else None,
        "parallel_size": deployment.parallel_size if deployment else None,
        "errors": [p._asdict() for p in errors or []],
    }
    print(json.dumps(result, indent=2))
