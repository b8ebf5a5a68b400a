"""`engram hash`: the EngramConfig digest of a deployment, as a given vLLM version computes it."""

from __future__ import annotations

import argparse
from typing import Any

from engram.commands import add_command
from engram.commands.validate import add_deployment_inputs, deployment_from_args


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "hash")
    add_deployment_inputs(parser)
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--vllm",
        metavar="VERSION",
        help="the digest of this vLLM version's EngramConfig (0.32, 0.33 or 0.34; the newest by default)",
    )
    which.add_argument(
        "--older-names",
        action="store_true",
        help="the digest under the fields' first names (thp_packing), as the seed's EngramConfig computed it",
    )
    parser.set_defaults(run=run_hash)


def run_hash(args: argparse.Namespace) -> int:
    """The digest, then two spaces and what it is the digest of (as sha256sum prints a file's)."""
    config = deployment_from_args(args).engram
    which = {"vllm": args.vllm, "older_names": args.older_names}
    print(f"{config.compute_hash(**which)}  {config.digest_name(**which)}")
    return 0
