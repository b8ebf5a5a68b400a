"""`engram make-checkpoint`: a deterministic synthetic checkpoint for tests and the demo."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engram.apps.presets import PRESETS, get_preset
from engram.commands import add_command
from engram.errors import EngramError
from engram.ops.formats import FORMATS
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import vllm_refusals, write_checkpoint
from engram.terminal import printable


def register(subparsers: Any) -> None:
    check = add_command(subparsers, "check-checkpoint")
    check.add_argument("path", type=Path, help="checkpoint directory or file")
    check.add_argument(
        "--verify", action="store_true", help="also check every file's sha256 against the SHA256SUMS beside it"
    )
    check.set_defaults(run=run_check)
    parser = add_command(subparsers, "make-checkpoint")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="directory to write model.safetensors (or model.pt) and config.json into",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(FORMATS),
        help="row format (default: the preset's): fp8 with ue8m0 block-32 scales (DeepSeek V4.1), fp8-table "
        "(one scale per table) or nvfp4 (Qwen4Exp), bf16, fp16, fp32",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=["safetensors", "pt"], default="safetensors")
    parser.add_argument(
        "--split-parts",
        type=int,
        metavar="N",
        help="write each table as N shard_<k> parts of ceil(rows/N) rows, as Qwen4Exp checkpoints split them (split_ngram_parts)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not 0 <= args.seed < 1 << 63:
        raise EngramError(f"--seed must be between 0 and 2**63 - 1, got {args.seed}")
    spec = get_preset(args.preset)
    try:
        path = write_checkpoint(
            spec, args.out, dtype=args.dtype, seed=args.seed, fmt=args.format, split_parts=args.split_parts
        )
    except OSError as exc:
        raise EngramError(
            f"cannot write the checkpoint into {args.out}: {exc.strerror or exc}; choose another --out"
        ) from None
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    for reason in vllm_refusals(spec, args.dtype or spec.dtype, args.split_parts):
        print(f"note: vLLM 0.33 cannot load this checkpoint: {reason}")
    return 0


def run_check(args: argparse.Namespace) -> int:
    checkpoint = Checkpoint(args.path, verify=args.verify)
    verified = ", sha256 verified against SHA256SUMS" if args.verify else ""
    print(f"ok: {len(checkpoint.shapes)} tensors in {len(checkpoint.paths)} file(s){verified}")
    for name, (shape, dtype) in sorted(checkpoint.shapes.items()):
        print(f"  {printable(name)}: {list(shape)} {str(dtype).removeprefix('torch.')}")
    return 0
