"""Four independent engine processes on one node building the same tables with EngramTables.build:
node_sharing "node" (one sealed copy for all of them) against "off" (a private copy each), side by side.

Each engine is a fresh interpreter, its own torch.distributed world of one (no group ties them), with
{"cpu_offload": true, "dp_shared_memory": false}. They start one after another, each once the one before
is ready, as engines do when a node fills up. Measured: each engine's build time (EngramTables.build, the
first one's load included), and, with all of them alive after each has read every row once, the tables'
summed PSS against one table's bytes. Every engine's rows are compared with a private load's (a digest
of each table's bytes).

Targets: summed PSS at most 1.05x one table; every engine after the first ready in under 1 s, for a table
whose load takes seconds.
Run: python benchmarks/bench_node_sharing.py [--table-gb N] [--engines N] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _scratch import scratch_dir
from _timing import print_table

WAIT_S = 600.0


def spec_of(table_gb: float) -> Any:
    """A V4.1-shaped model (fp8 rows of 128 values, 2 layers) whose tables hold about `table_gb` GB."""
    from engram.ngram.spec import ModelSpec

    rows_per_head = int(table_gb * 1e9 / (2 * 4 * 3 * (128 + 4)))  # 2 tables x 4 heads x 3 n-gram orders
    return ModelSpec(
        name="bench-node",
        architecture="DeepseekV41ForCausalLM",
        hf_text_config={
            "engram_layer_ids": [1, 3],
            "engram_max_ngram_size": 3,
            "engram_n_heads": 4,
            "engram_head_dim": 128,
            "engram_vocab_size": [rows_per_head, rows_per_head + 1_000],
            "engram_compressed_vocab_size": 99_092,
            "engram_pad_token_id": 2,
        },
        dtype="fp8",
        tokenizer="deepseek-v4",
    )


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.005)


def worker(checkpoint: str, table_gb: float, sharing: str, report: Path) -> None:
    """One engine: build, read every row, say so; measure PSS when told; exit when told."""
    import torch
    import torch.distributed as dist

    from engram.config import ParallelConfig, load_config
    from engram.runtime.engine import EngramTables
    from engram.runtime.rank_tables import tables_pss

    dist.init_process_group("gloo", init_method=f"file://{report}.store", rank=0, world_size=1)
    config = load_config({"cpu_offload": True, "dp_shared_memory": False, "node_sharing": sharing}, env={})
    started = time.perf_counter()
    tables = EngramTables.build(spec_of(table_gb), config, ParallelConfig(), checkpoint, progress=False)
    build_s = time.perf_counter() - started
    digests = {}
    for shard in tables.shards:
        digest = hashlib.sha256(shard.weight.view(torch.uint8).numpy().tobytes())
        if shard.scale is not None:
            digest.update(shard.scale.view(torch.uint8).numpy().tobytes())
        digests[shard.name] = digest.hexdigest()
    stats = [{"origin": s.origin, "loaded_by": s.loaded_by} for s in tables.stats()]
    Path(f"{report}.ready").write_text(json.dumps({"build_s": build_s, "digests": digests, "stats": stats}))
    wait_for(Path(f"{report}.go"))
    Path(f"{report}.pss").write_text(json.dumps({"pss": tables_pss(tables.shards)}))
    wait_for(Path(f"{report}.exit"))


def read_json(path: Path, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"an engine failed (exit {proc.returncode}) before writing {path.name}")
        time.sleep(0.005)
    time.sleep(0.01)
    return dict(json.loads(path.read_text()))


def run_engines(checkpoint: Path, table_gb: float, sharing: str, engines: int, work: Path) -> list[dict[str, Any]]:
    """Start `engines` engines one after another; once all are ready, measure their PSS together."""
    procs, reports = [], []
    for i in range(engines):
        report = work / f"{sharing}-{i}"
        command = [sys.executable, __file__, "--worker", str(checkpoint), str(table_gb), sharing, str(report)]
        procs.append(subprocess.Popen(command, cwd=Path(__file__).parent))
        reports.append(report)
        read_json(Path(f"{report}.ready"), procs[-1])
    results = [read_json(Path(f"{r}.ready"), p) for r, p in zip(reports, procs, strict=True)]
    for report in reports:
        Path(f"{report}.go").touch()
    for result, report, proc in zip(results, reports, procs, strict=True):
        result.update(read_json(Path(f"{report}.pss"), proc))
    for report in reports:
        Path(f"{report}.exit").touch()
    for proc in procs:
        if proc.wait(timeout=WAIT_S) != 0:
            raise SystemExit(f"an engine exited {proc.returncode}")
    return results


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        checkpoint, table_gb, sharing, report = sys.argv[2:6]
        worker(checkpoint, float(table_gb), sharing, Path(report))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gb", type=float, default=2.0, help="bytes of tables, in GB (default 2)")
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from engram.runtime.checkpoints.writer import write_checkpoint

    spec = spec_of(args.table_gb)
    with scratch_dir() as work:
        checkpoint = work / "checkpoint"
        checkpoint.mkdir()
        write_checkpoint(spec, checkpoint, seed=3)
        runs = {s: run_engines(checkpoint, args.table_gb, s, args.engines, work) for s in ("off", "node")}
    table = spec.table_bytes
    reference = runs["off"][0]["digests"]
    summary = {
        sharing: {
            "build_s": [r["build_s"] for r in results],
            "pss_sum_bytes": sum(r["pss"] for r in results),
            "pss_over_one_table": sum(r["pss"] for r in results) / table,
            "origins": [sorted({s["origin"] for s in r["stats"]}) for r in results],
            "rows_equal_private": all(r["digests"] == reference for r in results),
        }
        for sharing, results in runs.items()
    }
    summary["table_bytes"] = table  # type: ignore[assignment]
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"{args.engines} independent engines, tables {table:,} bytes ({table / 2**30:.2f} GiB), pid {os.getpid()}")
    rows = []
    for sharing in ("off", "node"):
        s = summary[sharing]
        builds = s["build_s"]
        rows.append(
            [
                sharing,
                f"{builds[0]:.2f}",
                f"{max(builds[1:]):.3f}" if len(builds) > 1 else "-",
                f"{s['pss_over_one_table']:.3f}x",
                ", ".join("/".join(o) for o in s["origins"]),
                "yes" if s["rows_equal_private"] else "NO",
            ]
        )
    print_table(
        ["node_sharing", "first build s", "slowest later s", "summed PSS / table", "origins", "rows equal"], rows
    )
    node, off = summary["node"], summary["off"]
    later = max(node["build_s"][1:]) if args.engines > 1 else 0.0
    print(
        f"summed PSS {node['pss_over_one_table']:.3f}x one table (target <= 1.05x; private copies "
        f"{off['pss_over_one_table']:.2f}x); later engines ready in at most {later:.3f} s (target < 1 s) against "
        f"{node['build_s'][0]:.2f} s for the first load"
    )


if __name__ == "__main__":
    main()
