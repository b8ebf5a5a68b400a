"""GPU check, one command (under 8 minutes on an H200): build the CUDA kernels; check every kernel against
its CPU twin on fresh random data, writing into poisoned output buffers; then print a table: UVA gather
GB/s for 264-byte (fp8 row + scales), 512-byte and 2-KB rows from a pinned host table of 8 GiB or more
against pinned host-to-device cudaMemcpy (target >= 0.7x for rows of 512 bytes and more), device-resident
gather against device-to-device copy (target >= 0.6x), and hash tokens/s.

Run: python scripts/gpu_check.py [--table-gib 8] [--json OUT]. Exit 0 when every check passed.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from engram import kernels
from engram.ops import OUT_KINDS, gather_reference
from engram.presets import get_preset
from engram.runtime.storage import Placement, ShardFormat, TableShard, allocate

POISON = 0xA5
# (name, table dtype, dim, output dtype): the row formats of the checks and the benchmark
FORMATS = [
    ("fp8->bf16", "fp8", 256, torch.bfloat16),
    ("fp8->fp32", "fp8", 128, torch.float32),
    ("bf16 rows", "bf16", 256, torch.bfloat16),
    ("fp16 rows", "fp16", 64, torch.float16),
    ("fp32 rows", "fp32", 512, torch.float32),
]


def gpu_time(fn: Callable[[], object], repeat: int = 7) -> float:
    """Median seconds of fn() on the current stream, after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(float(start.elapsed_time(stop)) / 1e3)
    return statistics.median(times)


def fill_random(shard: TableShard, seed: int) -> None:
    """Random bytes (fp8 NaNs included), scales in a sane exponent range; tiled from a 64 MiB block."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    data = shard.weight.view(torch.uint8).view(-1)
    block = torch.randint(0, 256, (min(data.numel(), 64 << 20),), dtype=torch.uint8, generator=generator).to(
        data.device
    )
    for start in range(0, data.numel(), block.numel()):
        piece = data[start : start + block.numel()]
        piece.copy_(block[: piece.numel()])
    if shard.scale is not None:
        shard.scale.view(torch.uint8).copy_(
            torch.randint(110, 140, shard.scale.shape, dtype=torch.uint8, generator=generator).to(shard.scale.device)
        )


def make_shard(
    dtype: str, dim: int, rows: int, placement: Placement, runtime: kernels.LibraryRuntime, row_start: int = 0
) -> TableShard:
    return allocate(
        "check",
        ShardFormat(rows, dim, dtype),
        placement,
        row_start=row_start,
        runtime=runtime if placement != "device" else None,
        device="cuda",
    )


def launch_gather(
    library: ctypes.CDLL, shard: TableShard, ids: torch.Tensor, table_rows: int, out: torch.Tensor, flag: torch.Tensor
) -> None:
    raw = shard.scale is None
    status = library.engram_gather_cuda(
        shard.weight.data_ptr(), None if raw else shard.scale.data_ptr(), shard.rows, shard.format.dim,  # type: ignore[union-attr]
        shard.weight.shape[1] * shard.weight.element_size(), shard.row_start, table_rows, ids.data_ptr(), ids.numel(),
        out.data_ptr(), 0 if raw else OUT_KINDS[out.dtype], flag.data_ptr(), torch.cuda.current_stream().cuda_stream,
    )  # fmt: skip
    kernels.check(library, status, "engram_gather_cuda")


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bit for bit, NaNs of either sign counted equal."""
    got, want = got.cpu(), want.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    nan = torch.isnan(want.float())
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[want.element_size()]
    return bool(torch.equal(nan, torch.isnan(got.float())) and torch.equal(got[~nan].view(bits), want[~nan].view(bits)))


def check_gather(library: ctypes.CDLL, runtime: kernels.LibraryRuntime, results: list[dict[str, Any]]) -> None:
    for (name, dtype, dim, out_dtype), placement in ((f, p) for f in FORMATS for p in ("pinned", "device")):
        rows, row_start, table_rows = 5000, 1000, 8000
        shard = make_shard(dtype, dim, rows, placement, runtime, row_start)  # type: ignore[arg-type]
        fill_random(shard, seed=dim)
        ids = torch.randint(-1, table_rows, (4099,), generator=torch.Generator().manual_seed(dim)).cuda()
        out = torch.full(
            (ids.numel(), dim * torch.empty((), dtype=out_dtype).element_size()),
            POISON,
            dtype=torch.uint8,
            device="cuda",
        ).view(out_dtype)
        flag = torch.zeros(1, dtype=torch.int32, device="cuda")
        launch_gather(library, shard, ids, table_rows, out, flag)
        want = gather_reference(
            shard.weight.cpu(),
            None if shard.scale is None else shard.scale.cpu(),
            ids.cpu(),
            row_start,
            table_rows,
            out_dtype,
        )
        bad = ids.clone()
        bad[7] = table_rows  # an id outside the table: zeros and the flag, never a read out of bounds
        launch_gather(library, shard, bad, table_rows, out.clone(), flag)
        results.append({"check": f"gather {name} {placement}", "ok": same_bits(out, want) and int(flag.item()) == 1})
        shard.release()


def check_hash(results: list[dict[str, Any]]) -> None:
    for preset in ("deepseek-v4.1-flash", "qwen4-exp-ple"):
        spec = get_preset(preset)
        hasher = spec.hasher()
        generator = torch.Generator().manual_seed(5)
        ids = torch.randint(0, spec.vocab, (100_003,), generator=generator)
        dead = torch.rand(ids.numel(), generator=generator) < 0.01
        want = hasher.hash(ids, dead)
        poisoned = torch.full(want.shape, -12345, dtype=torch.int64, device="cuda")
        state = hasher.new_state()
        got = hasher.hash(ids.cuda(), dead.cuda(), state, out=poisoned)
        chunked, state = hasher.hash_with_state(ids[:50_000].cuda(), dead[:50_000].cuda())
        rest, _ = hasher.hash_with_state(ids[50_000:].cuda(), dead[50_000:].cuda(), state)
        ok = same_bits(got, want) and same_bits(torch.cat([chunked, rest]), want)
        results.append({"check": f"ngram hash {preset}", "ok": ok})


def copy_ceilings() -> tuple[float, float]:
    """GB/s of a pinned host-to-device cudaMemcpy (1 GiB) and of a device-to-device copy (4 GiB, bytes
    copied, i.e. read once and written once)."""
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    h2d = (1 << 30) / gpu_time(functools.partial(device.copy_, host, non_blocking=True)) / 1e9
    big = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    copy = torch.empty_like(big)
    d2d = (4 << 30) / gpu_time(functools.partial(copy.copy_, big)) / 1e9
    return h2d, d2d


def bench(library: ctypes.CDLL, runtime: kernels.LibraryRuntime, table_gib: float) -> list[dict[str, Any]]:
    rows_out: list[dict[str, Any]] = []
    h2d, d2d = copy_ceilings()
    lookups = 1 << 20
    for label, dtype, dim in (("264 B (fp8 + scales)", "fp8", 256), ("512 B", "bf16", 256), ("2 KiB", "fp32", 512)):
        fmt = ShardFormat(1, dim, dtype)
        for placement, ceiling, name in (("pinned", h2d, "UVA (pinned host)"), ("device", d2d, "device")):
            table = table_gib if placement == "pinned" else min(table_gib, 16.0)
            rows = int(table * 2**30) // fmt.row_bytes
            shard = make_shard(dtype, dim, rows, placement, runtime)  # type: ignore[arg-type]
            fill_random(shard, seed=rows % 997)
            ids = torch.randint(0, rows, (lookups,), device="cuda")
            out_dtype = torch.bfloat16 if dtype == "fp8" else shard.weight.dtype
            out = torch.empty((lookups, dim), dtype=out_dtype, device="cuda")
            flag = torch.zeros(1, dtype=torch.int32, device="cuda")
            seconds = gpu_time(functools.partial(launch_gather, library, shard, ids, rows, out, flag))
            gbps = lookups * fmt.row_bytes / seconds / 1e9
            rows_out.append(
                {
                    "rows": label,
                    "table": name,
                    "table_gib": round(rows * fmt.row_bytes / 2**30, 1),
                    "gather_gbps": gbps,
                    "ceiling": "H2D memcpy" if placement == "pinned" else "D2D copy",
                    "ceiling_gbps": ceiling,
                    "ratio": gbps / ceiling,
                }
            )
            shard.release()
            del out, ids
            torch.cuda.empty_cache()
    spec = get_preset("deepseek-v4.1-flash")
    tokens = torch.randint(0, spec.vocab, (4 << 20,), device="cuda")
    hasher = spec.hasher()
    buffer = torch.empty((tokens.numel(), len(spec.layer_ids), spec.layout.columns), dtype=torch.int64, device="cuda")
    seconds = gpu_time(functools.partial(hasher.hash, tokens, out=buffer))
    rows_out.append({"rows": "ngram hash V4.1", "table": "device", "tokens_per_s": tokens.numel() / seconds})
    return rows_out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table-gib", type=float, default=8.0)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    started = time.perf_counter()
    library = kernels.load(kernels.build())
    runtime = kernels.LibraryRuntime(library)
    print(f"{torch.cuda.get_device_name()}: kernels built in {time.perf_counter() - started:.1f} s")
    results: list[dict[str, Any]] = []
    check_gather(library, runtime, results)
    check_hash(results)
    for result in results:
        print(f"  {'ok  ' if result['ok'] else 'FAIL'} {result['check']}")
    table = bench(library, runtime, args.table_gib)
    print(f"\n{'rows':<22} {'table':<18} {'GiB':>6} {'gather GB/s':>12} {'ceiling':>11} {'GB/s':>8} {'ratio':>6}")
    for row in table:
        if "tokens_per_s" in row:
            print(f"{row['rows']:<22} {row['table']:<18} {'':>6} {row['tokens_per_s'] / 1e9:>9.2f} G tokens/s")
        else:
            print(
                f"{row['rows']:<22} {row['table']:<18} {row['table_gib']:>6} {row['gather_gbps']:>12.1f} {row['ceiling']:>11} {row['ceiling_gbps']:>8.1f} {row['ratio']:>5.2f}x"
            )
    print("targets: UVA gather >= 0.7x H2D memcpy for rows of 512 B and more; device gather >= 0.6x D2D copy")
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"checks": results, "bench": table}, f, indent=2)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
