"""How much CPU the configuration commands cost from a cold interpreter: `engram validate` and `engram hash`
of a deployment document, `engram schema` and `engram docs`, each run as its own process, beside a bare
`python -c pass` and `engram demo --help` (a command that imports torch) taken in turn. CPU is user +
system time of the child (getrusage), the median of --repeat rounds; wall time is shown too.

Target: each configuration command under 0.2 s of CPU.
Run: python benchmarks/bench_cli_start.py [--repeat N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _timing import print_table

TARGET_CPU_S = 0.2
DOCUMENT = {"engram": {"cpu_offload": True, "dp_shared_memory": True}, "parallel": {"data_parallel_size": 2}}


def cost(argv: list[str]) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one run of `argv`."""
    before = os.times()
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=120)
    wall = time.perf_counter() - start
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        document = Path(tmp) / "deployment.json"
        document.write_text(json.dumps(DOCUMENT))
        engram = [sys.executable, "-m", "engram"]
        cases = {
            "python -c pass (the floor)": [sys.executable, "-c", "pass"],
            "engram validate DOC": [*engram, "validate", str(document)],
            "engram hash DOC": [*engram, "hash", str(document)],
            "engram schema": [*engram, "schema"],
            "engram docs": [*engram, "docs"],
            "engram demo --help (imports torch)": [*engram, "demo", "--help"],
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for _ in range(args.repeat):  # in turn, so every case sees the same machine
            for name, argv in cases.items():
                runs[name].append(cost(argv))
    results = {
        name: {
            "cpu_s": statistics.median(c for c, _ in timings),
            "wall_s": statistics.median(w for _, w in timings),
        }
        for name, timings in runs.items()
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"median of {args.repeat} runs each, taken in turn; target: a configuration command under {TARGET_CPU_S} s CPU"
    )
    print_table(
        ["command", "CPU", "wall", "meets the target"],
        [
            [name, f"{r['cpu_s'] * 1e3:.0f} ms", f"{r['wall_s'] * 1e3:.0f} ms",
             "" if not name.startswith("engram") or "demo" in name else str(r["cpu_s"] < TARGET_CPU_S)]
            for name, r in results.items()
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
