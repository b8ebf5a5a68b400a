"""The files one lookup passes through, per lookup mode (bench_host_time's modes and tables): every engram
module whose code runs during one Table.lookup, after warm-up, in the order first entered, counted
beside those of the runtime (engram/runtime/). For docs/architecture.md's drawing of a lookup's path.
--against DIR traces another checkout of engram (its own process) beside this one.
Run: python benchmarks/lookup_paths.py [--against DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from bench_host_time import MODE_DIM, MODE_ROWS, MODES, ROOT, TOKENS, checkpoint_in


def traced(call: Any) -> list[str]:
    """The engram files whose code runs during `call()`, in the order first entered."""
    import engram

    package = str(Path(engram.__file__).parent)
    seen: dict[str, None] = {}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(package):
            seen.setdefault(os.path.relpath(name, Path(package).parent), None)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return list(seen)


def paths() -> dict[str, list[str]]:
    from engram.runtime.checkpoints.loader import Checkpoint
    from engram.runtime.shard import ShardFormat
    from engram.runtime.table import open_table

    fmt = ShardFormat(MODE_ROWS, MODE_DIM, "bf16")
    ids = torch.randint(0, MODE_ROWS, (TOKENS, 24), generator=torch.Generator().manual_seed(3))
    found = {}
    with checkpoint_in("/dev/shm") as tmpfs, checkpoint_in(str(ROOT)) as disk:
        for mode in MODES:
            if mode.startswith("memory"):
                table = open_table("bench", fmt, "host")
            else:
                table = open_table("bench", fmt, "file", checkpoint=Checkpoint(tmpfs if "tmpfs" in mode else disk))
            if "tier" in mode:
                name = "ram" if "RAM" in mode else "device"
                table.keep_hot(8 << 20, "cpu", name, **({"window_ids": ids.numel()} if name == "device" else {}))
            for _ in range(3):
                table.lookup(ids)
                table.refresh()
            found[mode] = traced(lambda t=table: t.lookup(ids))
            table.release()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", type=Path, help="another checkout of engram, traced beside this one")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(paths()))
        return
    trees = [ROOT] if args.against is None else [args.against.resolve(), ROOT]
    results = []
    for tree in trees:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        done = subprocess.run(
            [sys.executable, __file__, "--worker"], env=env, capture_output=True, text=True, timeout=600, check=True
        )
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for mode in MODES:
        print(f"## {mode}")
        for tree, found in zip(trees, results, strict=True):
            runtime = [f for f in found[mode] if f.startswith("engram/runtime/")]
            print(f"{tree}: {len(found[mode])} files, {len(runtime)} in the runtime")
            print("    " + "\n    ".join(found[mode]))


if __name__ == "__main__":
    main()
