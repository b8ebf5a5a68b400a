"""Pods on one node holding the same tables: each engine process in network, pid, IPC, mount, UTS and time
namespaces of its own and a memory cgroup of its own, as Kubernetes gives each pod, side by side in three
ways: private copies (node_sharing "off"), node_sharing "node" without a rendezvous directory (engines meet
in their network namespace, so each pod loads its own), and node_sharing "node" with one node_dir every pod
sees (one copy for the node).

Each engine opens rows [0, N) of each table of a V4.1-shaped model (engram.runtime.rank_tables.open_tables, no
torch.distributed: a new network namespace has no interface up), reads every row once, then reports. The
pods start one after another, each once the one before is ready. Measured: each pod's time to ready, the
tables' summed PSS against one table's bytes with every pod alive, what each pod's cgroup is charged
(its memory usage, and of it the shared-memory pages: a node copy's), and whether every pod's rows equal a
private load's.

Targets: with node_dir, summed PSS at most 1.05x one table, each attaching pod's cgroup charged under 5%
of the table beyond the process itself, later pods ready in under 1 s. Needs root (namespaces, cgroups).
Run: python benchmarks/bench_pods.py [--table-gb N] [--pods N] [--json]
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
from bench_node_sharing import WAIT_S, read_json, spec_of, wait_for

NAMESPACES = ["--net", "--pid", "--ipc", "--mount", "--uts", "--time", "--fork", "--mount-proc", "--kill-child"]
MODES = {"private": ("off", False), "node, no node_dir": ("node", False), "node, node_dir": ("node", True)}


def worker(checkpoint: str, table_gb: float, sharing: str, node_dir: str, report: Path) -> None:
    """One pod's engine: open and read the tables, say so; measure PSS when told; exit when told."""
    import torch

    from engram.runtime.checkpoints.loader import Checkpoint
    from engram.runtime.rank_tables import open_tables, tables_pss

    spec = spec_of(table_gb)
    placement = "node" if sharing == "node" else "host"
    started = time.perf_counter()
    shards = open_tables(spec, Checkpoint(checkpoint), placement, progress=False, node_dir=node_dir or None)
    ready_s = time.perf_counter() - started
    digests = {}
    for shard in shards:
        digest = hashlib.sha256(shard.weight.view(torch.uint8).numpy().tobytes())
        if shard.scale is not None:
            digest.update(shard.scale.view(torch.uint8).numpy().tobytes())
        digests[shard.name] = digest.hexdigest()
    origins = sorted({"attached" if getattr(s, "attached", False) else "loaded" for s in shards})
    Path(f"{report}.ready").write_text(json.dumps({"ready_s": ready_s, "digests": digests, "origins": origins}))
    wait_for(Path(f"{report}.go"))
    Path(f"{report}.pss").write_text(json.dumps({"pss": tables_pss(shards)}))
    wait_for(Path(f"{report}.exit"))


def memory_cgroup() -> tuple[Path, bool]:
    """This process's memory cgroup directory, and whether it is cgroup v2's."""
    lines = [line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in lines if "memory" in controllers.split(",")]
    if v1:
        return Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/"), False
    return Path("/sys/fs/cgroup") / lines[-1][2].lstrip("/"), True


class Pod:
    """One engine in namespaces and a memory cgroup of its own."""

    def __init__(self, cgroup: Path, command: list[str]) -> None:
        self.cgroup = cgroup
        cgroup.mkdir()
        procs = cgroup / "cgroup.procs"
        self.proc = subprocess.Popen(
            ["unshare", *NAMESPACES, *command],
            cwd=Path(__file__).parent,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),  # before exec: all it starts
        )

    def charge(self, v2: bool) -> dict[str, int]:
        """The cgroup's memory usage and, of it, shared-memory pages (a memfd's)."""
        usage = int((self.cgroup / ("memory.current" if v2 else "memory.usage_in_bytes")).read_text())
        stat = dict(line.split() for line in (self.cgroup / "memory.stat").read_text().splitlines())
        return {"usage": usage, "shmem": int(stat.get("shmem", 0))}

    def close(self) -> None:
        if self.proc.wait(timeout=WAIT_S) != 0:
            raise SystemExit(f"a pod exited {self.proc.returncode}")
        deadline = time.monotonic() + 30
        while True:  # a cgroup goes once its last process is reaped
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def run_pods(checkpoint: Path, table_gb: float, mode: str, pods: int, work: Path) -> list[dict[str, Any]]:
    """Start `pods` pods one after another; once all are ready, measure their PSS and charges together."""
    sharing, with_dir = MODES[mode]
    node_dir = work / f"rendezvous-{sharing}" if with_dir else None
    root, v2 = memory_cgroup()
    started, reports = [], []
    tag = mode.replace(",", "").replace(" ", "-")
    for i in range(pods):
        report = work / f"{tag}-{i}"
        command = [
            sys.executable,
            __file__,
            "--worker",
            str(checkpoint),
            str(table_gb),
            sharing,
            str(node_dir or ""),
            str(report),
        ]
        started.append(Pod(root / f"engram-bench-{os.getpid()}-{tag}-{i}", command))
        reports.append(report)
        read_json(Path(f"{report}.ready"), started[-1].proc)
    results = [read_json(Path(f"{r}.ready"), p.proc) for r, p in zip(reports, started, strict=True)]
    for report in reports:
        Path(f"{report}.go").touch()
    for result, report, pod in zip(results, reports, started, strict=True):
        result.update(read_json(Path(f"{report}.pss"), pod.proc))
        result.update(pod.charge(v2))
    for report in reports:
        Path(f"{report}.exit").touch()
    for pod in started:
        pod.close()
    return results


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        checkpoint, table_gb, sharing, node_dir, report = sys.argv[2:7]
        worker(checkpoint, float(table_gb), sharing, node_dir, Path(report))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table-gb", type=float, default=2.0, help="bytes of tables, in GB (default 2)")
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_pods needs root: it makes namespaces and memory cgroups")
    from engram.runtime.checkpoints.writer import write_checkpoint

    spec = spec_of(args.table_gb)
    with scratch_dir() as work:
        checkpoint = work / "checkpoint"
        checkpoint.mkdir()
        write_checkpoint(spec, checkpoint, seed=3)
        runs = {mode: run_pods(checkpoint, args.table_gb, mode, args.pods, work) for mode in MODES}
    table = spec.table_bytes
    reference = runs["private"][0]["digests"]
    baseline = min(r["usage"] for r in runs["private"]) - table  # a pod's own process, without its table
    summary: dict[str, Any] = {
        mode: {
            "ready_s": [r["ready_s"] for r in results],
            "pss_over_one_table": sum(r["pss"] for r in results) / table,
            "charged_over_table": [(r["usage"] - baseline) / table for r in results],
            "shmem_over_table": [r["shmem"] / table for r in results],
            "origins": ["/".join(r["origins"]) for r in results],
            "rows_equal_private": all(r["digests"] == reference for r in results),
        }
        for mode, results in runs.items()
    }
    summary["table_bytes"] = table
    summary["process_bytes"] = baseline
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"{args.pods} pods, tables {table:,} bytes ({table / 2**30:.2f} GiB), a pod's process about {baseline / 2**20:.0f} MiB besides"
    )
    rows = []
    for mode in MODES:
        s = summary[mode]
        rows.append(
            [
                mode,
                f"{s['ready_s'][0]:.2f}",
                f"{max(s['ready_s'][1:]):.3f}" if len(s["ready_s"]) > 1 else "-",
                f"{s['pss_over_one_table']:.3f}x",
                " ".join(f"{c:.3f}" for c in s["charged_over_table"]),
                ", ".join(s["origins"]),
                "yes" if s["rows_equal_private"] else "NO",
            ]
        )
    print_table(
        [
            "mode",
            "first ready s",
            "slowest later s",
            "summed PSS / table",
            "cgroup charge / table, per pod",
            "origins",
            "rows equal",
        ],
        rows,
    )
    shared = summary["node, node_dir"]
    print(
        f"with node_dir: summed PSS {shared['pss_over_one_table']:.3f}x one table (target <= 1.05x); attaching pods "
        f"charged at most {max(shared['charged_over_table'][1:], default=0):.3f}x the table (target < 0.05); later "
        f"pods ready in at most {max(shared['ready_s'][1:], default=0):.3f} s (target < 1 s)"
    )


if __name__ == "__main__":
    main()
