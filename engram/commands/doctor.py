"""`engram doctor`: check this machine (and, given a plan, its sizes) before loading tables."""

from __future__ import annotations

import argparse
import json
from typing import Any

from engram.apps.doctor import run_checks
from engram.apps.presets import PRESETS
from engram.commands import add_command, add_engine_arg
from engram.commands.plan import build_plan
from engram.config import add_deployment_args, add_engram_args, document_from_args, validate_deployment
from engram.runtime.placement.shm import reclaim_stale, shm_dir


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "doctor")
    parser.add_argument(
        "--preset", choices=sorted(PRESETS), help="check against the plan of this preset and the parallel flags"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--clean",
        action="store_true",
        help="first remove named shared-table files whose creator crashed (ENGRAM_SHM_DIR, or /dev/shm)",
    )
    add_engram_args(parser)
    add_deployment_args(parser)
    add_engine_arg(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if (
        args.clean
    ):  # a rendezvous directory (node_dir) is cleaned by its own check: every look removes what the dead left
        removed = reclaim_stale(shm_dir())
        print(f"removed {len(removed)} shared table file(s) left by crashed processes in {shm_dir()}")
        for path in removed:
            print(f"  {path}")
    # Flags are checked even without a preset (a TP of 0 is an error, not ignored).
    plan, given = build_plan(args) if args.preset else (None, None)
    config = plan.config if plan is not None else validate_deployment(document_from_args(args, {})).engram
    checks = run_checks(plan, given, node_dir=config.node_dir)
    if args.json:
        print(json.dumps([c.as_dict() for c in checks], indent=2))
    else:
        for c in checks:
            print(
                f"{c.status:<4}  {c.name}: {c.detail}"
                + (f"\n      fix: {c.fix}" if c.fix and c.status != "pass" else "")
            )
    return 1 if any(c.status == "fail" for c in checks) else 0
