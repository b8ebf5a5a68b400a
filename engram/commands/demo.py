"""`engram demo`: the whole system on this machine in under a minute (what `make demo` runs)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from engram.apps.demo import default_device, run_demo
from engram.apps.presets import PRESETS, get_preset
from engram.commands import add_command
from engram.config import add_engram_args, document_from_args, validate_deployment

MIB = 1 << 20


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "demo")
    parser.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    parser.add_argument("--dp", type=int, default=2, help="data-parallel replicas (default 2)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks per replica (default 1)")
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where the replicas hash and look up (default auto: the GPU when CUDA is available)",
    )
    parser.add_argument("--json", action="store_true")
    add_engram_args(parser)
    parser.set_defaults(run=run)


def node_copies(tables: dict[str, list[dict[str, Any]]]) -> str:
    """Which rank loaded each node copy and which attached it, from each rank's EngramTables.stats()."""
    said = []
    for rank, stats in sorted(tables.items(), key=lambda item: int(item[0])):
        loaded = sum(s["origin"] == "loaded" for s in stats)
        attached = sorted({s["loaded_by"] for s in stats if s["origin"] == "attached"})
        parts = [f"loaded {loaded}"] if loaded else []
        parts += [f"attached {len(stats) - loaded} (loaded by pid {', '.join(map(str, attached))})"] if attached else []
        said.append(f"rank {rank} {' and '.join(parts)}")
    return "; ".join(said)


def run(args: argparse.Namespace) -> int:
    spec = get_preset(args.preset)
    document = {
        "engram": {"dp_shared_memory": args.dp > 1},
        "model": msgspec.to_builtins(spec.model_config()),
        "parallel": {"tensor_parallel_size": args.tp, "data_parallel_size": args.dp},
        "load": {"load_format": "safetensors"},
        "platform": "cpu",
    }
    deployment = validate_deployment(document_from_args(args, document))
    report = run_demo(spec, deployment, device=default_device() if args.device == "auto" else args.device)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["match"] else 1
    shared = report["host_pss_bytes"] / report["table_bytes"]
    print(
        f"engram demo: preset {report['preset']}, TP {report['tensor_parallel_size']} x DP {report['data_parallel_size']}, tables {report['placement']} on {report['device']}"
    )
    print(
        f"  config      {' '.join(f'{k}={str(v).lower()}' for k, v in report['engram'].items())}  hash {report['hash'][:16]}"
    )
    print(
        f"  tables      {report['table_rows']:,} rows, {report['table_bytes']:,} bytes ({report['table_bytes'] / MIB:.1f} MiB)"
    )
    print(
        f"  host memory {report['host_pss_bytes']:,} bytes of table PSS summed over the replicas ({shared:.2f}x one table); private copies would cost {report['private_estimate_bytes']:,}"
    )
    if report["placement"] == "file":
        print(
            f"  start       {report['load_seconds']:.3f} s to map the checkpoint's tables: nothing copied, where a "
            f"copying placement first reads and writes {report['table_bytes']:,} bytes"
        )
    else:
        print(f"  load        {report['load_seconds']:.2f} s, {report['load_bytes_per_second'] / 1e9:.2f} GB/s")
    if report["placement"] == "node":
        print(f"  node copies {node_copies(report['tables'])}")
    print(f"  first step  lookups done {report['first_lookup_seconds']:.3f} s after start")
    print(
        f"  lookups     {report['lookups_per_second'] / 1e6:.2f} M rows/s over {report['data_parallel_size']} replicas ({', '.join(map(str, report['tokens']))} tokens: {report['token_source']})"
    )
    print(
        f"  results     {'match the single-process reference' if report['match'] else 'DIFFER from the single-process reference'}"
    )
    return 0 if report["match"] else 1
