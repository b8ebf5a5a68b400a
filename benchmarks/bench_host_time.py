"""Host time of one eager layer call (EngramEmbedding, 64 tokens x 24 columns of V4.1 rows), the kernel
stubbed out, so what is left is what the host spends before the GPU gets the launch: the module call, one
custom-op dispatch, the argument checks and the id preparation. Beside it, in the same run: one stock
aten op on the same ids (torch.index_select into a kept buffer, the floor of any op dispatch), and the two
pieces the CUDA launch adds on top of the CPU path: the registered-memory check of a host table
(registration.is_registered) and the 16-argument ctypes call (into a stub library with the same C ABI,
tests/ops/stub_cuda.c). Target: at most 30 us for the GPU call.

Then one lookup of the same ids per lookup mode (a table in memory, alone and through a device tier; a
file on tmpfs, alone and through a device tier; a file on disk with its pages cached, alone and through a
RAM tier holding every row asked for), the CPU's gather included: what a lookup costs the host in each.

--against DIR runs the same measurements over another checkout of engram (DIR: a `git worktree` of an
earlier commit) in turns with this one, each in a process of its own, and prints each figure's ratio,
this checkout's over DIR's (the median of the turns'): a refactor's before and after, side by side.
Run: python benchmarks/bench_host_time.py [--json] [--against DIR] [--turns N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from _timing import median_seconds, print_table

from engram.apps.presets import get_preset
from engram.memory import registration
from engram.memory.mapping import map_anonymous
from engram.ops import LAUNCHERS, cuda
from engram.ops.build import build_library
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.storage import allocate
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import ShardFormat

TOKENS = 64
ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "tests" / "ops" / "stub_cuda.c"
MODE_ROWS, MODE_DIM = 1 << 16, 128  # bf16 rows: 16 MiB a table
MODES = (
    "memory", "memory, device tier", "file on tmpfs", "file on tmpfs, device tier", "file on disk (cached)",
    "file on disk, RAM tier (hits)",
)  # fmt: skip


def stub_library() -> ctypes.CDLL:
    path = build_library("engram_stub", [STUB], "cc", ["-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"])
    return cuda.load(path)


class AlwaysRegistered:
    """A runtime whose registrations succeed: the check below then finds the table in the live registry."""

    def host_register(self, addr: int, size: int, flags: int) -> int:
        return 0

    def host_unregister(self, addr: int) -> int:
        return 0

    def host_get_device_pointer(self, addr: int) -> tuple[int, int]:
        return 0, addr

    def pointer_memory_type(self, addr: int) -> tuple[int, int]:
        return 0, registration.MEMORY_TYPE_HOST

    def device_attribute(self, attribute: int) -> tuple[int, int]:
        return 0, 1

    def get_last_error(self) -> int:
        return 0

    def error_string(self, code: int) -> str:
        return "no error"


def layer_figures() -> dict[str, float]:
    """The eager layer call's host time and the pieces beside it (module docstring)."""
    spec = get_preset("deepseek-v4.1-flash")
    columns, dim, rows = spec.layout.columns, spec.head_dim, 1 << 16
    shard = allocate("bench", ShardFormat(rows, dim, "fp8"), "host")
    layer = EngramEmbedding(shard, TableShardPlan("bench", rows, "row", 0, rows, 0, columns), columns=columns)
    ids = torch.randint(0, rows, (TOKENS, columns), generator=torch.Generator().manual_seed(1))
    out = layer(ids)
    flat = ids.reshape(-1)
    kept = torch.empty((flat.numel(), dim), dtype=torch.uint8)
    raw = shard.weight.view(torch.uint8)

    real = LAUNCHERS["cpu"]
    LAUNCHERS["cpu"] = lambda call: None  # the kernel stubbed: host work only
    try:
        kept_us = median_seconds(lambda: layer(ids, out=out), number=2000) * 1e6
        fresh_us = median_seconds(lambda: layer(ids), number=2000) * 1e6
    finally:
        LAUNCHERS["cpu"] = real
    aten_us = median_seconds(lambda: torch.index_select(raw, 0, flat, out=kept), number=2000) * 1e6

    mapping = map_anonymous(1 << 20, kind="pinned")
    runtime = AlwaysRegistered()
    registration.register(mapping, runtime)
    check_us = (
        median_seconds(lambda: registration.is_registered(runtime, mapping.addr, mapping.size), number=20000) * 1e6
    )
    library = stub_library()
    library.stub_set.argtypes = [ctypes.c_int] * 4
    library.stub_set(0, 0, 0, 0)
    launch = (1, 2, rows, dim, dim, 0, rows, 3, None, None, flat.numel(), 4, 2, 0, 1.0, 5, 0, 6)
    ctypes_us = median_seconds(lambda: library.engram_gather_cuda(*launch), number=20000) * 1e6
    mapping.release()
    return {
        "layer_call_kept_out_us": kept_us,
        "layer_call_fresh_out_us": fresh_us,
        "aten_index_select_us": aten_us,
        "registered_check_us": check_us,
        "ctypes_call_us": ctypes_us,
        "gpu_eager_call_estimate_us": kept_us + check_us + ctypes_us,
    }


@contextmanager
def checkpoint_in(parent: str) -> Iterator[Path]:
    """A safetensors checkpoint of one bf16 table `bench.weight` [MODE_ROWS, MODE_DIM] under `parent`."""
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(prefix="engram-bench-", dir=parent) as directory:
        rows = torch.randn(MODE_ROWS, MODE_DIM, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
        save_file({"bench.weight": rows}, str(Path(directory) / "model.safetensors"))
        yield Path(directory)


def mode_figures() -> dict[str, float]:
    """One lookup of 64 tokens x 24 columns per lookup mode, the gather included (module docstring), in us.
    Only names both sides of a refactor have are used: open_table, Table.keep_hot with its tier named."""
    from engram.runtime.checkpoints.loader import Checkpoint
    from engram.runtime.table import open_table

    fmt = ShardFormat(MODE_ROWS, MODE_DIM, "bf16")
    ids = torch.randint(0, MODE_ROWS, (TOKENS, 24), generator=torch.Generator().manual_seed(3))
    budget = 8 << 20  # 2 MiB of state aside, more rows than the ids ask for
    figures: dict[str, float] = {}
    with checkpoint_in("/dev/shm") as tmpfs, checkpoint_in(str(ROOT)) as disk:
        for mode in MODES:
            if mode.startswith("memory"):
                table = open_table("bench", fmt, "host")
                table.weight.copy_(
                    torch.randn(MODE_ROWS, MODE_DIM).to(torch.bfloat16)
                )  # its pages touched, as the files'
            else:
                table = open_table("bench", fmt, "file", checkpoint=Checkpoint(tmpfs if "tmpfs" in mode else disk))
            if "tier" in mode:
                name = "ram" if "RAM" in mode else "device"
                table.keep_hot(budget, "cpu", name, **({"window_ids": ids.numel()} if name == "device" else {}))
            for _ in range(3):  # pages cached, the tier filled (a device tier at its refresh)
                table.lookup(ids)
                table.refresh()
            figures[f"lookup: {mode}"] = median_seconds(lambda t=table: t.lookup(ids), number=500, repeat=9) * 1e6
            table.release()
    return figures


def measure() -> dict[str, float]:
    return {**layer_figures(), **mode_figures()}


def in_turns(against: Path, turns: int) -> dict[str, list[float]]:
    """Each figure's ratio, this checkout's over `against`'s, per turn (the two measured one after the
    other in processes of their own, each importing its own checkout's engram, each first in every other
    turn)."""
    ratios: dict[str, list[float]] = {}
    for turn in range(turns):
        measured: dict[Path, dict[str, float]] = {}
        for tree in (against, ROOT) if turn % 2 == 0 else (ROOT, against):  # who goes first, in turn
            env = {**os.environ, "PYTHONPATH": str(tree)}
            done = subprocess.run(
                [sys.executable, __file__, "--worker"], env=env, capture_output=True, text=True, timeout=600, check=True
            )
            figures = json.loads(done.stdout.strip().splitlines()[-1])
            if figures.pop("engram_at") != str(tree / "engram"):
                raise SystemExit(f"the worker for {tree} imported engram from elsewhere")
            measured[tree] = figures
        for key, after in measured[ROOT].items():
            ratios.setdefault(key, []).append(after / measured[against][key])
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--against", type=Path, help="another checkout of engram to compare this one with")
    parser.add_argument("--turns", type=int, default=3, help="turns of the comparison (default 3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import engram

        print(json.dumps({**measure(), "engram_at": str(Path(engram.__file__).parent)}))
        return
    if args.against is not None:
        ratios = in_turns(args.against.resolve(), args.turns)
        print_table(
            ["figure", f"this checkout / {args.against} (median of {args.turns} turns)", "each turn"],
            [[k, f"{statistics.median(v):.3f}x", " ".join(f"{r:.3f}" for r in v)] for k, v in ratios.items()],
        )
        if args.json:
            print(json.dumps({k: statistics.median(v) for k, v in ratios.items()}, indent=2))
        return
    figures = measure()
    kept_us, fresh_us, aten_us = (
        figures[k] for k in ("layer_call_kept_out_us", "layer_call_fresh_out_us", "aten_index_select_us")
    )
    check_us, ctypes_us, gpu_estimate = (
        figures[k] for k in ("registered_check_us", "ctypes_call_us", "gpu_eager_call_estimate_us")
    )
    print_table(
        ["what (64 tokens x 24 columns, kernel stubbed)", "host us", "vs one aten op"],
        [
            ["EngramEmbedding(ids, out=kept)", f"{kept_us:.1f}", f"{kept_us / aten_us:.1f}x"],
            ["EngramEmbedding(ids), fresh output", f"{fresh_us:.1f}", f"{fresh_us / aten_us:.1f}x"],
            ["torch.index_select(out=kept), one aten op", f"{aten_us:.1f}", "1.0x"],
            ["+ registered-table check (CUDA launch)", f"{check_us:.1f}", ""],
            ["+ 16-argument ctypes call (CUDA launch)", f"{ctypes_us:.1f}", ""],
            ["= eager GPU layer call, estimated (target 30)", f"{gpu_estimate:.1f}", f"{gpu_estimate / aten_us:.1f}x"],
        ],
    )
    print()
    print_table(
        ["one lookup, 64 tokens x 24 columns, CPU gather included", "host us"],
        [
            [key.removeprefix("lookup: "), f"{value:.1f}"]
            for key, value in figures.items()
            if key.startswith("lookup: ")
        ],
    )
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
