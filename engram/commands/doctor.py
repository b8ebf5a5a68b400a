"""`engram doctor`: check this machine (and, given a plan, its sizes) before loading tables."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engram.commands.plan import build_plan
from engram.config import add_deployment_args, add_engram_args
from engram.doctor import run_checks
from engram.presets import PRESETS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check shm, huge pages, memlock, memory, CUDA and nvcc (against a plan with --preset)"
    )
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="check against the plan of this preset and the parallel flags"
    )
    parser.add_argument("--json", action="store_true")
    add_engram_args(parser)
    add_deployment_args(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    checks = run_checks(build_plan(args) if args.preset else None)
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for c in checks:
            print(
                f"{c.status:<4}  {c.name}: {c.detail}"
                + (f"\n      fix: {c.fix}" if c.fix and c.status != "pass" else "")
            )
    return 1 if any(c.status == "fail" for c in checks) else 0
