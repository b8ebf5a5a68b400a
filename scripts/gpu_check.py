"""The GPU acceptance test of the whole runtime, in stage groups (GROUPS) that --only/--skip select:

- kernels: every kernel against its CPU twin on fresh random data, into poisoned output buffers; the op
  paths (e8m0 scale bytes 0 and 0xFF, a grid capped by limit_blocks, the device cache, prefetch, the
  pinned error flag raised by gathered and by `check` ids); the online device tier (refreshes equal to
  the uncached lookup, its mapping rewritten in place, a CUDA graph captured before a refresh replaying
  the refreshed tier, replays counted);
- hash: the CUDA n-gram hash against the CPU, whole and chunked, and its token-id flag;
- placements: `EngramTables.build(platform="cuda")` for every placement (device, pinned, huge pages,
  /dev/shm shared by two processes on the one GPU, embedding_across_dp and TP 2 with two processes), from a
  checkpoint written by `engram make-checkpoint`, each lookup compared bit for bit with the CPU reference,
  with a CUDA-graph capture and replay at a decode shape and torch.compile(fullgraph=True) where the rank
  can; file: the file-backed placements (checkpoint on disk, and on tmpfs read over UVA);
- vllm: where vLLM 0.33 is installed in this Python, engram's vLLM plugin against vLLM's own tables
  through vLLM's CUDA path (tests/vllm/test_plugin.py with ENGRAM_VLLM_DEVICE=cuda); skipped without vLLM;
- bench-*: gather GB/s of three row formats against the pinned H2D memcpy and the D2D copy; V4.1 rows
  from pinned tables of 1, 8 and 32 GiB, uniform and real-text ids, decode (256 tokens, timed as CUDA-graph
  replays) and prefill (8,192 tokens), plain and sorted; the device cache of hot rows (a static 5% profile
  and a 1% online tier fed real text) against the uncached lookup; the host time of one
  eager layer call; random-row gathers from one table in registered 4 KiB pages, registered THP and
  host-NUMA cuMem (2 MiB GPU pages) side by side; a decode step with prefetched lookups beside stand-in
  compute; hash tokens/s.

The kernel build always runs first. Every stage is guarded: a failure is reported (ok/FAIL and the error)
and the next stage still runs; with --json the report is rewritten after every stage, so a run cut short
keeps what it measured. A GPU window is short (one command at most 10 minutes), so run it in two calls of
under 4 minutes each (docs/architecture.md, "On a GPU"):
    python scripts/gpu_check.py --only kernels hash placements file --json OUT/gpu-checks.json
    python scripts/gpu_check.py --only bench --json OUT/gpu-bench.json
Exit 0 when every stage run passed, 1 when any failed, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from engram.apps.corpus import Corpus, load_corpus, text_rows
from engram.apps.presets import get_preset, scaled_preset
from engram.config import validate_deployment
from engram.errors import EngramError
from engram.memory.host_numa import map_host_numa
from engram.memory.mapping import map_anonymous
from engram.ops import GatherCall, cuda, gather, gather_into, gather_reference, kernel_ids, use_sorted
from engram.ops.segments import dense
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.hugepages import map_huge
from engram.runtime.placement.storage import allocate, shard_over
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import Placement, ShardFormat, TableShard

POISON = 0xA5
# (name, table dtype, dim, output dtype): the row formats of the checks and the benchmark
FORMATS = [
    ("fp8->bf16", "fp8", 256, torch.bfloat16),
    ("fp8->fp32", "fp8", 128, torch.float32),
    ("bf16 rows", "bf16", 256, torch.bfloat16),
    ("fp16 rows", "fp16", 64, torch.float16),
    ("fp32 rows", "fp32", 512, torch.float32),
    ("fp8-table->bf16", "fp8-table", 80, torch.bfloat16),  # Qwen4Exp: one scale per table
    ("nvfp4->bf16", "nvfp4", 80, torch.bfloat16),  # Qwen4Exp: e2m1 pairs, e4m3 block-16 scales
    ("nvfp4->fp32", "nvfp4", 256, torch.float32),
]
# (stage name, engram config, TP, DP, extra checks): every placement through EngramTables on the GPU
PLACEMENTS: list[tuple[str, dict[str, bool], int, int, tuple[str, ...]]] = [
    ("device", {"cpu_offload": False}, 1, 1, ("graph", "compile")),
    ("pinned", {}, 1, 1, ("graph", "compile")),
    ("hugepages", {"use_thp": True}, 1, 1, ("graph",)),
    ("shm, DP 2 sharing one mapping", {"dp_shared_memory": True}, 1, 2, ("graph",)),
    ("embedding_across_dp, DP 2", {"embedding_across_dp": True}, 1, 2, ("graph",)),
    ("TP 2, pinned", {}, 2, 1, ("graph",)),
]


@dataclass
class Stage:
    name: str
    ok: bool
    seconds: float
    error: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


# Stage groups, in the order they run; --only/--skip take these names (or a prefix before "-": "bench").
GROUPS = (
    "kernels",
    "hash",
    "placements",
    "file",
    "vllm",
    "bench-formats",
    "bench-sorted",
    "bench-cache",
    "bench-host",
    "bench-host-pages",
    "bench-prefetch",
    "bench-hash",
)


def selected_groups(only: list[str] | None, skip: list[str]) -> set[str]:
    """The groups --only and --skip leave (a name selects itself and the groups it prefixes before "-")."""

    def matching(names: list[str]) -> set[str]:
        unknown = [n for n in names if not any(g == n or g.startswith(n + "-") for g in GROUPS)]
        if unknown:
            raise SystemExit(f"gpu_check: unknown stage group {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
        return {g for g in GROUPS for n in names if g == n or g.startswith(n + "-")}

    return (matching(only) if only else set(GROUPS)) - matching(skip)


@dataclass
class Report:
    stages: list[Stage] = field(default_factory=list)
    bench: list[dict[str, Any]] = field(default_factory=list)
    groups: set[str] = field(default_factory=lambda: set(GROUPS))
    json_path: Path | None = None  # rewritten after every stage, so a run cut short keeps what it measured

    def wants(self, *groups: str) -> bool:
        return any(g in self.groups for g in groups)

    def run(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> Stage:
        """Run one stage; any exception fails it (with its last line, and the traceback for a bug) and
        the next stage runs regardless. A stage fails by raising, or by returning {"ok": False, ...}."""
        started = time.perf_counter()
        try:
            detail = fn() or {}
            stage = Stage(name, bool(detail.pop("ok", True)), time.perf_counter() - started, detail=detail)
        except Exception as exc:  # the report must list every stage, whatever failed
            error = str(exc) if isinstance(exc, EngramError) else traceback.format_exc(limit=-3).strip()
            stage = Stage(name, False, time.perf_counter() - started, error=error)
        print(
            f"  {'ok  ' if stage.ok else 'FAIL'} {name} ({stage.seconds:.1f} s){'  ' + stage.error.splitlines()[-1] if stage.error else ''}",
            flush=True,
        )
        self.stages.append(stage)
        self.save()
        return stage

    def save(self) -> None:
        if self.json_path is not None:
            partial = self.json_path.with_name(self.json_path.name + ".part")
            partial.write_text(json.dumps(self.as_dict(), indent=2))
            partial.replace(self.json_path)  # never a half-written report

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(s.ok for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "groups": sorted(self.groups, key=GROUPS.index),
            "stages": [asdict(s) for s in self.stages],
            "bench": self.bench,
        }


def gpu_time(fn: Callable[[], object], repeat: int = 7) -> float:
    """Median seconds of fn() on the current stream, after a warm-up: one call between two events, right
    for calls long enough that the GPU, not the host's launches, sets the pace (prefill, copies)."""
    return _event_time(fn, 1, repeat)


def graph_time(fn: Callable[[], object], calls: int = 32, repeat: int = 7) -> float:
    """Median seconds of one fn() on the GPU alone: `calls` of them captured in one CUDA graph and timed
    as replays, so a short call (a decode step) is not measured as the host's cost of launching it."""
    fn()  # warm-up: lazy initialisation happens outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return _event_time(graph.replay, calls, repeat)


def _event_time(fn: Callable[[], object], calls: int, repeat: int) -> float:
    """Median seconds per call of fn() making `calls` calls, timed between two events after a warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(float(start.elapsed_time(stop)) / 1e3 / calls)
    return statistics.median(times)


def fill_random(shard: TableShard, seed: int) -> None:
    """Random bytes (fp8 NaNs included), scales in a sane exponent range; tiled from a 64 MiB block."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    data = dense(shard.weight).view(torch.uint8).view(-1)
    block = torch.randint(0, 256, (min(data.numel(), 64 << 20),), dtype=torch.uint8, generator=generator).to(
        data.device
    )
    for start in range(0, data.numel(), block.numel()):
        piece = data[start : start + block.numel()]
        piece.copy_(block[: piece.numel()])
    if shard.scale is not None:  # ue8m0 near 2^0; e4m3 block scales any byte (NaNs included)
        scale = dense(shard.scale)
        low, high = (110, 140) if scale.dtype == torch.float8_e8m0fnu else (0, 256)
        scale.view(torch.uint8).copy_(
            torch.randint(low, high, scale.shape, dtype=torch.uint8, generator=generator).to(scale.device)
        )
    if shard.table_scale is not None:
        shard.table_scale.fill_(0.0123456789)


def make_shard(
    dtype: str, dim: int, rows: int, placement: Placement, runtime: cuda.LibraryRuntime, row_start: int = 0
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
    library: ctypes.CDLL,
    shard: TableShard,
    ids: torch.Tensor,
    table_rows: int,
    out: torch.Tensor,
    flag: torch.Tensor,
    sorted_form: bool = False,
) -> None:
    """The kernel through its C ABI (cuda.gather_cuda), with a flag of the check's own, past the op's
    argument checks."""
    flat, order, leader = kernel_ids(ids, sorted_form)
    table_scale = None if shard.table_scale is None else float(shard.table_scale[0])
    scale = None if shard.scale is None else dense(shard.scale)
    cuda.gather_cuda(
        library, dense(shard.weight), scale, flat, order, leader, shard.row_start, table_rows, out, flag, 0, table_scale
    )


BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal bit for bit, NaNs of either sign counted equal; any dtype (integers have no NaN)."""
    got, want = got.cpu(), want.cpu()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if not (want.is_floating_point() or want.is_complex()):
        return bool(torch.equal(got, want))
    nan = torch.isnan(want.float())
    bits = BITS[want.element_size()]
    return bool(torch.equal(nan, torch.isnan(got.float())) and torch.equal(got[~nan].view(bits), want[~nan].view(bits)))


def check_gather(
    library: ctypes.CDLL, runtime: cuda.LibraryRuntime, name: str, placement: Placement, sorted_form: bool = False
) -> dict[str, Any]:
    _, dtype, dim, out_dtype = next(f for f in FORMATS if f[0] == name)
    rows, row_start, table_rows = 5000, 1000, 8000
    shard = make_shard(dtype, dim, rows, placement, runtime, row_start)
    try:
        fill_random(shard, seed=dim)
        generator = torch.Generator().manual_seed(dim)
        pool = torch.randint(-1, table_rows, (1500,), generator=generator)
        ids = pool[torch.randint(0, pool.numel(), (4099,), generator=generator)].cuda()  # duplicates galore
        out = torch.full(
            (ids.numel(), dim * torch.empty((), dtype=out_dtype).element_size()),
            POISON,
            dtype=torch.uint8,
            device="cuda",
        ).view(out_dtype)
        flag = torch.zeros(1, dtype=torch.int32, device="cuda")
        launch_gather(library, shard, ids, table_rows, out, flag, sorted_form)
        clean = int(flag.item())
        want = gather_reference(
            dense(shard.weight).cpu(),
            None if shard.scale is None else dense(shard.scale).cpu(),
            ids.cpu(),
            row_start,
            table_rows,
            out_dtype,
            table_scale=None if shard.table_scale is None else float(shard.table_scale[0]),
        )
        bad = ids.clone()
        bad[7] = table_rows  # an id outside the table: zeros and the flag, never a read out of bounds
        launch_gather(library, shard, bad, table_rows, out.clone(), flag, sorted_form)
        return {
            "ok": same_bits(out, want) and clean == 0 and int(flag.item()) == 1,
            "rows_equal": same_bits(out, want),
            "flag_after_good_ids": clean,
            "flag_after_bad_id": int(flag.item()),
        }
    finally:
        shard.release()


def raised(fn: Callable[[], object]) -> str:
    """The EngramError fn() raised, or "" when it returned."""
    try:
        fn()
    except EngramError as exc:
        return str(exc)
    return ""


ROW_FLAG = "a gather on cuda:{} was given a row id outside its table (it read zeros instead)"


def check_op_paths(runtime: cuda.LibraryRuntime) -> dict[str, Any]:
    """Exact comparisons of what the raw kernel checks do not reach, through the ops on a pinned fp8 table:
    e8m0 scale bytes 0 (2^-127) and 0xFF (NaN) against the reference; a grid capped by limit_blocks, the
    device cache of hot rows and prefetched rows, each against the plain eager rows; and the pinned error
    flag of the op path, raised by a bad id in the gathered ids and by one in the `check` ids only."""
    from engram.runtime.engine import prefetch_on
    from engram.runtime.tiers.device import DeviceTier
    from engram.runtime.tiers.hot_rows import cached_gather

    rows, columns = 5000, 16
    shard = make_shard("fp8", 256, rows, "pinned", runtime)
    device = torch.cuda.current_device()
    try:
        fill_random(shard, seed=11)
        assert shard.scale is not None
        weight, scale = dense(shard.weight), dense(shard.scale)
        scale.view(torch.uint8)[:40] = 0
        scale.view(torch.uint8)[40:80] = 0xFF
        generator = torch.Generator().manual_seed(12)
        ids = torch.randint(-1, rows, (256, columns), generator=generator)
        ids[:5] = torch.arange(80).view(5, columns)  # the rows with extreme scales
        want = gather_reference(weight.cpu(), scale.cpu(), ids, 0, rows, torch.bfloat16)
        on_gpu = ids.cuda()
        before = raised(cuda.check_error_flags)
        plain = gather(shard.weight, shard.scale, on_gpu, 0, rows, torch.bfloat16)
        with cuda.limit_blocks(1):
            capped = gather(shard.weight, shard.scale, on_gpu, 0, rows, torch.bfloat16)
        hot = torch.unique(ids[ids >= 0])[:1000]
        tier = DeviceTier(shard, hot.numel(), "cuda", policy="static")
        tier.warm(hot)
        cached = cached_gather(tier.rows, GatherCall(shard.weight, shard.scale, on_gpu, 0, rows, torch.bfloat16))
        layer = EngramEmbedding(shard, TableShardPlan("check", rows, "row", 0, rows, 0, columns), columns=columns)
        eager = layer(on_gpu)
        prefetched = prefetch_on(torch.cuda.Stream(), lambda: [layer(on_gpu)], sm_share=0.25).take(0)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        clean = raised(cuda.check_error_flags)
        bad = on_gpu.clone()
        bad[3, 7] = rows
        gather(shard.weight, shard.scale, bad, 0, rows, torch.bfloat16)
        torch.cuda.synchronize()
        gathered_bad = raised(cuda.check_error_flags)
        gather(shard.weight, shard.scale, on_gpu[:, :8], 0, rows, torch.bfloat16, False, bad)
        torch.cuda.synchronize()
        checked_bad = raised(cuda.check_error_flags)
    finally:
        shard.release()
    results = {
        "e8m0 scales 0 and 0xFF equal the reference": same_bits(plain, want),
        "limit_blocks(1) equals the uncapped grid": same_bits(capped, plain),
        "device cache equals uncached": same_bits(cached, plain),
        "prefetched equals eager": same_bits(prefetched, eager) and same_bits(eager, plain),
        "pinned flag clean after good ids": clean == "",
        "pinned flag raised by a bad gathered id": gathered_bad == ROW_FLAG.format(device),
        "pinned flag raised by a bad id in check only": checked_bad == ROW_FLAG.format(device),
    }
    return {"ok": all(results.values()), "flag_before_the_stage": before, **results}


def check_online_tier(runtime: cuda.LibraryRuntime) -> dict[str, Any]:
    """The online device tier over a pinned fp8 table: lookups equal the uncached ones across refreshes,
    the refresh rewrites the row-to-slot mapping in place (same addresses), and a CUDA graph captured
    before a refresh reads the refreshed tier when replayed (its rows still equal the uncached ones); the
    device counters count the replays too."""
    from engram.runtime.table import Table
    from engram.runtime.tiers.windowed import WindowedAdmission

    rows, columns = 200_000, 16
    shard = make_shard("fp8", 256, rows, "pinned", runtime)
    try:
        fill_random(shard, seed=21)
        table, plain = Table(shard, rows), Table(shard, rows)
        table.keep_hot(4 << 20, "cuda", window_ids=1 << 14, half_life=4)
        tier = table.tier
        assert tier is not None
        generator = torch.Generator().manual_seed(22)
        weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64)
        steps = [
            torch.multinomial(weights, 256 * columns, True, generator=generator).view(256, columns).cuda()
            for _ in range(24)
        ]
        equal = all(same_bits(table.lookup(ids), plain.lookup(ids)) for ids in steps)
        assert isinstance(tier.admission, WindowedAdmission)  # a device tier: refreshed in place, between steps
        pointers = (tier.admission.keys.data_ptr(), tier.admission.slots.data_ptr(), tier.rows.weight.data_ptr())
        static_ids = steps[0].clone()
        out = torch.empty(256, columns, 256, dtype=torch.bfloat16, device="cuda")
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out.copy_(table.lookup(static_ids))
        before = tier.stats()
        admitted = table.refresh()
        graph.replay()
        torch.cuda.synchronize()
        replayed = same_bits(out, plain.lookup(static_ids))
        after = tier.stats()
        results = {
            "online tier equals uncached across refreshes": equal and tier.refreshes > 0,
            "refresh rewrites the mapping in place": pointers
            == (tier.admission.keys.data_ptr(), tier.admission.slots.data_ptr(), tier.rows.weight.data_ptr()),
            "a graph replayed after a refresh reads the refreshed tier": replayed,
            "replays are counted": after.lookups == before.lookups + static_ids.numel(),
            "hits + misses = lookups": after.hits + after.misses == after.lookups,
        }
        return {"ok": all(results.values()), "admitted_by_the_last_refresh": admitted, "tier": asdict(after), **results}
    finally:
        shard.release()


def check_hash(preset: str) -> dict[str, Any]:
    spec = get_preset(preset)
    hasher = spec.hasher()
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, spec.vocab, (100_003,), generator=generator)
    dead = torch.rand(ids.numel(), generator=generator) < 0.01
    want = hasher.hash(ids, dead)
    poisoned = torch.full(want.shape, -12345, dtype=torch.int64, device="cuda")
    got = hasher.hash(ids.cuda(), dead.cuda(), hasher.new_state(), out=poisoned)
    chunked, state = hasher.hash_with_state(ids[:50_000].cuda(), dead[:50_000].cuda())
    rest, _ = hasher.hash_with_state(ids[50_000:].cuda(), dead[50_000:].cuda(), state)
    whole, pieces = same_bits(got, want), same_bits(torch.cat([chunked, rest]), want)
    raised(cuda.check_error_flags)  # start clean
    bad = ids[:100].cuda()
    bad[3] = spec.vocab  # outside the vocabulary: flagged, no sync, no exception in the call
    hasher.hash(bad)
    torch.cuda.synchronize()
    expected = (
        f"the n-gram hash on cuda:{torch.cuda.current_device()} was given a compressed token id outside the "
        "vocabulary (its row ids are meaningless); compress raw token ids first"
    )
    flagged = raised(cuda.check_error_flags) == expected
    return {"ok": whole and pieces and flagged, "whole": whole, "chunked": pieces, "bad token flagged": flagged}


def write_checkpoint_cli(preset: str, out: Path) -> Path:
    """A checkpoint written as a user would: `engram make-checkpoint`."""
    subprocess.run(
        [sys.executable, "-m", "engram", "make-checkpoint", "--preset", preset, "--out", str(out)],
        check=True,
        timeout=300,
        capture_output=True,
    )
    return out


def check_placement(
    preset: str, checkpoint: Path, engram: dict[str, bool], tp: int, dp: int, extras: tuple[str, ...], device: str
) -> dict[str, Any]:
    """The demo's replicas on `device` with this placement: lookups equal the CPU reference bit for bit,
    and every extra check passes (or says why this rank cannot run it, e.g. graphs with collectives)."""
    from engram.apps.demo import run_demo  # imports the launcher; the kernel-only stages do not need it

    deployment = validate_deployment(
        {
            "engram": engram,
            "parallel": {"tensor_parallel_size": tp, "data_parallel_size": dp},
            "load": {"load_format": "safetensors"},
            "platform": device,
        }
    )
    report = run_demo(get_preset(preset), deployment, device=device, checkpoint=checkpoint, extras=extras, timeout=300)
    failed = [
        f"{name} on rank {rank}"
        for name, per_rank in report["checks"].items()
        for rank, v in enumerate(per_rank)
        if v is False
    ]
    return {
        "ok": report["match"] and not failed,
        "match": report["match"],
        "placement": report["placement"],
        "device": report["device"],
        "backend": report["backend"] + " (NCCL refuses two ranks on one GPU)" if tp * dp > 1 else report["backend"],
        "checks": report["checks"],
        "failed_checks": failed,
        "load_seconds": report["load_seconds"],
        "lookups_per_second": report["lookups_per_second"],
    }


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


SHAPES = {"decode": 256, "prefill": 8192}  # tokens of a step; V4.1 reads 24 columns a token per layer


def step_time(shape: str, fn: Callable[[], object]) -> float:
    """GPU seconds of one lookup: a decode step is timed as CUDA-graph replays (one eager call would
    measure the host's launches, not the GPU), a prefill step eagerly."""
    return graph_time(fn) if shape == "decode" else gpu_time(fn)


def bench_formats(
    library: ctypes.CDLL, runtime: cuda.LibraryRuntime, table_gib: float, ceilings: dict[str, float]
) -> list[dict[str, Any]]:
    """The kernels' raw reach: 1M uniform lookups of each row format, pinned host and device tables."""
    rows_out: list[dict[str, Any]] = []
    lookups = 1 << 20
    formats = (
        ("264 B (fp8 + scales)", "fp8", 256),
        ("512 B", "bf16", 256),
        ("2 KiB", "fp32", 512),
        ("80 B (Qwen fp8-table)", "fp8-table", 80),
        ("45 B (Qwen nvfp4 + scales)", "nvfp4", 80),
    )
    for label, dtype, dim in formats:
        fmt = ShardFormat(1, dim, dtype)
        for placement in ("pinned", "device"):
            table = table_gib if placement == "pinned" else min(table_gib, 16.0)
            rows = int(table * 2**30) // fmt.row_bytes
            shard = make_shard(dtype, dim, rows, placement, runtime)
            fill_random(shard, seed=rows % 997)
            ids = torch.randint(0, rows, (lookups,), device="cuda")
            out_dtype = torch.bfloat16 if dtype in ("fp8", "fp8-table", "nvfp4") else shard.weight.dtype
            out = torch.empty((lookups, dim), dtype=out_dtype, device="cuda")
            flag = torch.zeros(1, dtype=torch.int32, device="cuda")
            seconds = gpu_time(functools.partial(launch_gather, library, shard, ids, rows, out, flag))
            ceiling = "H2D memcpy" if placement == "pinned" else "D2D copy"
            rows_out.append(
                bench_row(
                    f"{label}, uniform, 1M",
                    placement,
                    rows * fmt.row_bytes,
                    lookups * fmt.row_bytes / seconds,
                    ceiling,
                    ceilings,
                )
            )
            shard.release()
            del out, ids
            torch.cuda.empty_cache()
    return rows_out


def bench_row(
    what: str, table: str, table_bytes: int, bytes_per_s: float, ceiling: str, ceilings: dict[str, float]
) -> dict[str, Any]:
    gbps = bytes_per_s / 1e9
    return {
        "rows": what,
        "table": table,
        "table_gib": round(table_bytes / 2**30, 1),
        "gather_gbps": gbps,
        "ceiling": ceiling,
        "ceiling_gbps": ceilings[ceiling],
        "ratio": gbps / ceilings[ceiling],
    }


def v41_table(
    table_gib: float, runtime: cuda.LibraryRuntime, placement: Placement = "pinned"
) -> tuple[Any, TableShard]:
    """Layer 0's table of V4.1 scaled to `table_gib` (fp8 rows of 256 + 8 bytes of scales), random."""
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * table_gib * 2**30))
    shard = make_shard("fp8", spec.head_dim, spec.layout.table_rows[0], placement, runtime)
    fill_random(shard, seed=int(table_gib))
    return spec, shard


def id_batches(spec: Any, rows: int, corpus: torch.Tensor | None, tokens: int) -> dict[str, torch.Tensor]:
    """One layer's ids [tokens, columns] on the GPU: uniform over `rows`, and real text when there is a corpus."""
    batches = {"uniform": torch.randint(0, rows, (tokens, spec.layout.columns))}
    if corpus is not None:
        batches["real text"] = text_rows(spec, corpus, tokens, 2)[1][:, 0]
    return {source: ids.cuda() for source, ids in batches.items()}


def bench_sorted(
    runtime: cuda.LibraryRuntime, table_gib: float, corpus: torch.Tensor | None, ceilings: dict[str, float]
) -> list[dict[str, Any]]:
    """Effective GB/s (row bytes delivered / time) of the plain and the sorted gather through the op (the
    sort included), V4.1 rows, uniform and real-text ids, decode and prefill shapes."""
    spec, shard = v41_table(table_gib, runtime)
    rows = shard.rows
    out_rows: list[dict[str, Any]] = []
    try:
        for shape, tokens in SHAPES.items():
            for source, ids in id_batches(spec, rows, corpus, tokens).items():
                out = torch.empty((*ids.shape, spec.head_dim), dtype=torch.bfloat16, device="cuda")
                for sorted_form in (False, True):
                    call = functools.partial(gather_into, shard.weight, shard.scale, ids, 0, rows, out, sorted_form)
                    seconds = step_time(shape, call)
                    what = f"V4.1 {shape} {tokens}x24, {source}, {'sorted' if sorted_form else 'plain'}"
                    out_rows.append(
                        bench_row(
                            what,
                            "pinned",
                            rows * shard.format.row_bytes,
                            ids.numel() * shard.format.row_bytes / seconds,
                            "H2D memcpy",
                            ceilings,
                        )
                    )
        return out_rows
    finally:
        shard.release()
        torch.cuda.empty_cache()


def host_page_tables(table_gib: float, runtime: cuda.LibraryRuntime) -> dict[str, TableShard | str]:
    """One V4.1-shaped fp8 table (rows of 256 + 8 bytes of scales) in each kind of host memory a GPU can
    read: registered ordinary pages, registered transparent huge pages, and host-NUMA cuMem (2 MiB GPU
    pages); the reason instead where one cannot be had here."""
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * table_gib * 2**30))
    fmt = ShardFormat(spec.layout.table_rows[0], spec.head_dim, "fp8")
    made: dict[str, TableShard | str] = {}
    small = map_anonymous(fmt.nbytes, kind="pinned")
    made["registered 4 KiB pages"] = shard_over("pages", fmt, "pinned", small, runtime=runtime)
    huge = map_huge(fmt.nbytes)
    made["registered THP"] = shard_over("pages", fmt, "pinned", huge.mapping, runtime=runtime, note=huge.note)
    cumem = map_host_numa(fmt.nbytes, runtime)
    if isinstance(cumem, str):
        made["host-NUMA cuMem"] = cumem
    else:
        made["host-NUMA cuMem"] = shard_over("pages", fmt, "pinned", cumem, pointer=cumem.addr)
    for index, shard in enumerate(made.values()):
        if not isinstance(shard, str):
            fill_random(shard, seed=index)
    return made


def bench_host_pages(runtime: cuda.LibraryRuntime, table_gib: float) -> list[dict[str, Any]]:
    """Random-row gathers of one table in each kind of host memory (host_page_tables), side by side in one
    process: decode and prefill steps of uniform ids, plain and sorted, as GB/s of rows delivered and as a
    ratio to the registered 4 KiB pages, which a GPU maps with small pages: the question vLLM 0.34 and
    SGLang settle by claim (2 MiB GPU pages read random rows far faster), measured here."""
    tables = host_page_tables(table_gib, runtime)
    out_rows: list[dict[str, Any]] = []
    try:
        base: dict[tuple[str, bool], float] = {}
        for kind, shard in tables.items():
            if isinstance(shard, str):
                out_rows.append({"rows": f"host pages: {kind}", "table": "unavailable", "why": shard})
                continue
            columns = 24
            for shape, tokens in SHAPES.items():
                ids = torch.randint(0, shard.rows, (tokens, columns), generator=torch.Generator().manual_seed(tokens))
                ids = ids.cuda()
                out = torch.empty((tokens, columns, shard.format.dim), dtype=torch.bfloat16, device="cuda")
                for sorted_form in (False, True):
                    call = functools.partial(
                        gather_into, shard.weight, shard.scale, ids, 0, shard.rows, out, sorted_form
                    )
                    gbps = ids.numel() * shard.format.row_bytes / step_time(shape, call) / 1e9
                    base.setdefault((shape, sorted_form), gbps)
                    out_rows.append(
                        {
                            "rows": f"host pages: {kind}, {shape} {tokens}x{columns}, {'sorted' if sorted_form else 'plain'}",
                            "table": kind,
                            "table_gib": round(shard.format.nbytes / 2**30, 1),
                            "gather_gbps": gbps,
                            "vs_registered_4k": gbps / base[(shape, sorted_form)],
                        }
                    )
        return out_rows
    finally:
        for shard in tables.values():
            if not isinstance(shard, str):
                shard.release()
        torch.cuda.empty_cache()


def bench_host_time(runtime: cuda.LibraryRuntime) -> list[dict[str, Any]]:
    """Host time of one eager layer call at 64 tokens (no sync in the call: the GPU runs behind), and
    the same step replayed from a CUDA graph."""
    spec, shard = v41_table(1.0, runtime)
    try:
        plan = TableShardPlan("bench", shard.rows, "row", 0, shard.rows, 0, spec.layout.columns)
        layer = EngramEmbedding(shard, plan, columns=spec.layout.columns)
        ids = torch.randint(0, shard.rows, (64, spec.layout.columns), device="cuda")
        out = torch.empty((64, spec.layout.columns, spec.head_dim), dtype=torch.bfloat16, device="cuda")
        for _ in range(20):
            layer(ids, out=out)
        torch.cuda.synchronize()
        calls = 500
        started = time.perf_counter()
        for _ in range(calls):
            layer(ids, out=out)
        host_us = (time.perf_counter() - started) / calls * 1e6
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(ids, out=out)
        replay_s = gpu_time(graph.replay, repeat=50)
        return [
            {"rows": "eager host time, one layer, 64 tokens", "host_us": host_us, "graph_replay_us": replay_s * 1e6}
        ]
    finally:
        shard.release()


def bench_prefetch(runtime: cuda.LibraryRuntime, table_gib: float) -> list[dict[str, Any]]:
    """A decode step of a stand-in model (per layer a bf16 matmul of about a millisecond) with and without
    the step's V4.1 lookups (2 layers, 256 tokens) prefetched beside it: the target is at most 1.05x."""
    from engram.runtime.engine import prefetch_on

    spec, shard = v41_table(table_gib, runtime)
    try:
        plan = TableShardPlan("bench", shard.rows, "row", 0, shard.rows, 0, spec.layout.columns)
        layer = EngramEmbedding(shard, plan, columns=spec.layout.columns)
        rows = torch.randint(0, shard.rows, (SHAPES["decode"], 2, spec.layout.columns), device="cuda")
        a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        layers = 8

        def compute() -> None:
            for _ in range(layers):
                torch.mm(a, a)

        def with_prefetch() -> None:
            handle = prefetch_on(side, lambda: [layer(rows[:, i]) for i in range(2)], sm_share=0.25)
            for i in range(layers):
                torch.mm(a, a)
                if i in (1, 6):  # the Engram layers consume their rows
                    handle.take(0 if i == 1 else 1).float().sum()

        alone = gpu_time(compute)
        beside = gpu_time(with_prefetch)
        lookups = gpu_time(lambda: [layer(rows[:, i]) for i in range(2)])
        return [
            {
                "rows": "decode step, 8 stand-in layers, V4.1 lookups prefetched",
                "compute_ms": alone * 1e3,
                "with_prefetch_ms": beside * 1e3,
                "lookups_alone_ms": lookups * 1e3,
                "step_ratio": beside / alone,
            }
        ]
    finally:
        shard.release()


def bench_cache(
    runtime: cuda.LibraryRuntime,
    table_gib: float,
    corpus: torch.Tensor,
    fit: torch.Tensor,
    ceilings: dict[str, float],
) -> list[dict[str, Any]]:
    """The device cache of hot rows (5% of a V4.1 table, chosen on the corpus's fit part) against the
    uncached lookup, on held-out real text and on uniform ids, decode and prefill shapes; effective GB/s
    (row bytes delivered / time) against the H2D memcpy. Targets: >= 1.5x the memcpy on real text if the
    hit rates allow; at most 5% slower than uncached on uniform ids."""
    from engram.apps.profile import profile_tables
    from engram.runtime.table import Table
    from engram.runtime.tiers.device import DeviceTier
    from engram.runtime.tiers.hot_rows import cached_gather

    spec, shard = v41_table(table_gib, runtime)
    rows = shard.rows
    budget = int(0.05 * rows * shard.format.row_bytes)
    profile = profile_tables(spec, fit[:1_000_000], corpus[:10_000], [budget])[0]
    tier = DeviceTier(shard, budget // shard.format.row_bytes, "cuda", policy="static")
    tier.warm(profile.hot_rows)
    cache = tier.rows
    # the online tier of 1% of the rows, started empty and fed the corpus's fit text (50 prefill chunks)
    online = Table(shard, rows)
    online.keep_hot(int(0.01 * rows * (shard.format.row_bytes + 16)) + (8 << 20), "cuda")
    for step in text_rows(spec, fit, 8192, 50):
        online.lookup(step[:, 0].cuda())
    out_rows: list[dict[str, Any]] = []
    try:
        for shape, tokens in SHAPES.items():
            for source, ids in id_batches(spec, rows, corpus, tokens).items():
                sorted_form = use_sorted(ids.numel(), shard.weight, ids.device)
                plain = step_time(
                    shape,
                    functools.partial(gather, shard.weight, shard.scale, ids, 0, rows, torch.bfloat16, sorted_form),
                )
                cached = step_time(
                    shape,
                    functools.partial(
                        cached_gather,
                        cache,
                        GatherCall(shard.weight, shard.scale, ids, 0, rows, torch.bfloat16, sorted_form),
                    ),
                )
                online.refresh()  # now, not inside the timed lookups
                assert online.tier is not None
                learned = step_time(shape, functools.partial(online.lookup, ids))
                hits = float(torch.isin(ids, tier.admission.held_rows()).float().mean())
                online_hits = float(torch.isin(ids, online.tier.admission.held_rows()).float().mean())
                moved = ids.numel() * shard.format.row_bytes
                timed = (
                    ("uncached", plain), (f"5% static cache, {hits:.0%} hits", cached),
                    (f"1% online tier, {online_hits:.0%} hits", learned),
                )  # fmt: skip
                for label, seconds in timed:
                    out_rows.append(
                        bench_row(
                            f"V4.1 {shape}, {source}, {label}",
                            "pinned",
                            rows * shard.format.row_bytes,
                            moved / seconds,
                            "H2D memcpy",
                            ceilings,
                        )
                    )
        return out_rows
    finally:
        shard.release()
        del cache, tier, online
        torch.cuda.empty_cache()


def bench_hash() -> list[dict[str, Any]]:
    spec = get_preset("deepseek-v4.1-flash")
    tokens = torch.randint(0, spec.vocab, (4 << 20,), device="cuda")
    hasher = spec.hasher()
    buffer = torch.empty((tokens.numel(), len(spec.layer_ids), spec.layout.columns), dtype=torch.int64, device="cuda")
    seconds = gpu_time(functools.partial(hasher.hash, tokens, out=buffer))
    return [{"rows": "ngram hash V4.1", "table": "device", "tokens_per_s": tokens.numel() / seconds}]


def print_bench(table: list[dict[str, Any]]) -> None:
    print(f"\n{'rows':<44} {'table':<7} {'GiB':>5} {'GB/s':>7} {'ceiling':>11} {'GB/s':>6} {'ratio':>6}")
    for row in table:
        if "ceiling" in row:
            print(
                f"{row['rows']:<44} {row['table']:<7} {row['table_gib']:>5} {row['gather_gbps']:>7.1f} {row['ceiling']:>11} {row['ceiling_gbps']:>6.1f} {row['ratio']:>5.2f}x"
            )
        else:
            print(f"{row['rows']:<44} " + ", ".join(f"{k} {v:.3g}" for k, v in row.items() if isinstance(v, float)))


def run_all(report: Report, table_gib: float, sizes: list[float], preset: str, workdir: Path) -> None:
    """Every selected stage group in order (the build always runs: nothing else can without it)."""

    def build() -> dict[str, Any]:
        cuda.cuda_library()  # the library the ops use, and its runtime: its registrations are known
        return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}

    if not report.run("build the CUDA kernels", build).ok:
        return  # nothing below runs without them
    library, runtime = cuda.cuda_library(), cuda.library_runtime()
    if report.wants("kernels"):
        for name, *_ in FORMATS:
            for placement in ("pinned", "device"):
                for sorted_form in (False, True):
                    label = f"gather {name} {placement}{', sorted' if sorted_form else ''}"
                    report.run(label, functools.partial(check_gather, library, runtime, name, placement, sorted_form))
        report.run(
            "op paths: e8m0 extremes, block cap, device cache, prefetch, pinned flag", lambda: check_op_paths(runtime)
        )
        report.run("online device tier: refreshes in place, graph replays", lambda: check_online_tier(runtime))
    if report.wants("hash"):
        for hashed in ("deepseek-v4.1-flash", "qwen4-exp-ple"):
            report.run(f"ngram hash {hashed}", functools.partial(check_hash, hashed))
    if report.wants("placements", "file"):
        run_placements(report, preset, workdir / "checkpoint")
    if report.wants("vllm"):
        report.run("vLLM plugin on cuda: both families' tables against vLLM's own", check_vllm_plugin)
    if report.wants(*(g for g in GROUPS if g.startswith("bench-"))):
        run_benchmarks(report, library, runtime, table_gib, sizes)


def check_vllm_plugin() -> dict[str, Any]:
    """The plugin tests of tests/vllm (each placement's lookups bit-equal to vLLM's unmodified storage)
    with vLLM in this Python on this GPU: its CUDA kernels, its UVA views of engram's host mappings, the
    staged copy of a file-backed table on disk. Skipped (and said so) where vLLM is not installed."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vLLM is not installed in this Python (pip install vllm==0.33.0 to run this stage)"}
    env = {**os.environ, "ENGRAM_VLLM_PYTHON": sys.executable, "ENGRAM_VLLM_DEVICE": "cuda"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "tests/vllm/test_plugin.py", "-k", "serves"],
        env=env, capture_output=True, text=True, timeout=480, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    return {"ok": done.returncode == 0, "output": done.stdout[-3000:] + done.stderr[-1000:]}


def run_placements(report: Report, preset: str, checkpoint: Path) -> None:
    """EngramTables on cuda for every placement, from a checkpoint `engram make-checkpoint` wrote."""
    if not report.run(
        f"engram make-checkpoint --preset {preset}", lambda: {"path": str(write_checkpoint_cli(preset, checkpoint))}
    ).ok:
        return
    if report.wants("placements"):
        for label, engram, tp, dp, extras in PLACEMENTS:
            report.run(
                f"EngramTables on cuda: {label}",
                functools.partial(check_placement, preset, checkpoint, engram, tp, dp, extras, "cuda"),
            )
    if not report.wants("file"):
        return
    # file_backed: a checkpoint on disk is gathered on host threads and copied over (a sync per lookup,
    # so no graph); one on tmpfs is registered read-only and read over UVA like pinned tables (where the
    # GPU supports read-only registration; elsewhere it is gathered on host threads too).
    on_tmpfs = Path(tempfile.mkdtemp(prefix="engram-gpu-check-", dir="/dev/shm"))
    try:
        shutil.copytree(checkpoint, on_tmpfs, dirs_exist_ok=True)
        for label, where, extras in (
            ("file-backed, DP 2, checkpoint on disk (host gather, staged copy)", checkpoint, ()),
            ("file-backed, DP 2, checkpoint on tmpfs (UVA)", on_tmpfs, ("graph",)),
        ):
            report.run(
                f"EngramTables on cuda: {label}",
                functools.partial(check_placement, preset, where, {"file_backed": True}, 1, 2, extras, "cuda"),
            )
    finally:
        shutil.rmtree(on_tmpfs, ignore_errors=True)


def run_benchmarks(
    report: Report, library: ctypes.CDLL, runtime: cuda.LibraryRuntime, table_gib: float, sizes: list[float]
) -> None:
    ceilings: dict[str, float] = {}

    def measure(rows: list[dict[str, Any]]) -> dict[str, Any]:
        report.bench.extend(rows)
        return {}

    def copies() -> dict[str, Any]:
        ceilings["H2D memcpy"], ceilings["D2D copy"] = copy_ceilings()
        return dict(ceilings)

    if (
        report.wants("bench-formats", "bench-sorted", "bench-cache")
        and not report.run("bench: copy ceilings", copies).ok
    ):
        return
    if report.wants("bench-formats"):
        report.run("bench: row formats", lambda: measure(bench_formats(library, runtime, table_gib, ceilings)))
    corpus: list[Corpus] = []  # loaded once by its stage, read by the stages after it

    def real_text() -> dict[str, Any]:
        corpus.append(load_corpus())
        return {"tokens": corpus[0].tokens.numel(), "held_out_tokens": corpus[0].held_out.numel()}

    if report.wants("bench-sorted", "bench-cache"):
        report.run("bench: real-text corpus", real_text)

    def measure_sorted(gib: float) -> dict[str, Any]:
        return measure(bench_sorted(runtime, gib, corpus[0].held_out if corpus else None, ceilings))

    if report.wants("bench-sorted"):
        for gib in sizes:
            report.run(f"bench: plain and sorted, {gib:g} GiB", functools.partial(measure_sorted, gib))
    if report.wants("bench-cache") and corpus:
        report.run(
            f"bench: device cache, {sizes[-1]:g} GiB",
            lambda: measure(bench_cache(runtime, sizes[-1], corpus[0].held_out, corpus[0].fit, ceilings)),
        )
    if report.wants("bench-host"):
        report.run("bench: eager host time", lambda: measure(bench_host_time(runtime)))
    if report.wants("bench-host-pages"):
        report.run(
            f"bench: host pages, {min(sizes[-1], 8.0):g} GiB",
            lambda: measure(bench_host_pages(runtime, min(sizes[-1], 8.0))),
        )
    if report.wants("bench-prefetch"):
        report.run("bench: prefetch beside compute", lambda: measure(bench_prefetch(runtime, min(sizes[-1], 8.0))))
    if report.wants("bench-hash"):
        report.run("bench: ngram hash", lambda: measure(bench_hash()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=8.0, help="pinned table size for the benchmark")
    parser.add_argument(
        "--sorted-gib",
        type=float,
        nargs="+",
        default=[1.0, 8.0, 32.0],
        help="V4.1 table sizes of the plain/sorted rows",
    )
    parser.add_argument("--preset", default="demo", help="model of the placement stages (default demo, 262 MB)")
    parser.add_argument("--only", nargs="+", metavar="GROUP", help=f"run only these stage groups: {', '.join(GROUPS)}")
    parser.add_argument("--skip", nargs="+", default=[], metavar="GROUP", help="leave these stage groups out")
    parser.add_argument("--json", metavar="OUT", help="also write the report here, rewritten after every stage")
    args = parser.parse_args(argv)
    groups = selected_groups(args.only, args.skip)
    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine", file=sys.stderr)
        return 2
    started = time.perf_counter()
    report = Report(groups=groups, json_path=Path(args.json) if args.json else None)
    with tempfile.TemporaryDirectory(prefix="engram-gpu-check-") as workdir:
        run_all(report, args.table_gib, args.sorted_gib, args.preset, Path(workdir))
    print_bench(report.bench)
    failed = [s.name for s in report.stages if not s.ok]
    print(f"\n{len(report.stages) - len(failed)} passed, {len(failed)} failed in {time.perf_counter() - started:.0f} s")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
