"""Host time of one eager layer call (EngramEmbedding, 64 tokens x 24 columns of V4.1 rows), the kernel
stubbed out, so what is left is what the host spends before the GPU gets the launch: the module call, one
custom-op dispatch, the argument checks and the id preparation. Beside it, in the same run: one stock
aten op on the same ids (torch.index_select into a kept buffer, the floor of any op dispatch), and the two
pieces the CUDA launch adds on top of the CPU path: the registered-memory check of a host table
(registration.is_registered) and the 16-argument ctypes call (into a stub library with the same C ABI,
tests/ops/stub_cuda.c). Target: at most 30 us for the GPU call.
Run: python benchmarks/bench_host_time.py [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
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
STUB = Path(__file__).resolve().parent.parent / "tests" / "ops" / "stub_cuda.c"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = parser.parse_args()
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

    gpu_estimate = kept_us + check_us + ctypes_us
    figures = {
        "layer_call_kept_out_us": kept_us,
        "layer_call_fresh_out_us": fresh_us,
        "aten_index_select_us": aten_us,
        "registered_check_us": check_us,
        "ctypes_call_us": ctypes_us,
        "gpu_eager_call_estimate_us": gpu_estimate,
    }
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
    if args.json:
        print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
