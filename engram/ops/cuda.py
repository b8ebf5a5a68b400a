"""The CUDA kernels (kernels/*.cu): built with nvcc into a cache keyed by the sources' hash, loaded with
ctypes through the C ABI of kernels/engram_kernels.h, and entered in engram.ops' launch tables as the CUDA
kernels of engram::gather, engram::gather_into and engram::ngram_hash. Also the CUDA runtime that pins host
tables (registration.py).

Nothing in a launch allocates device memory behind torch's back or synchronises, so the ops can be
captured in CUDA graphs, and nothing synchronises: in eager mode as under capture, the kernel reads zeros
for an id outside its table and raises a flag in pinned host memory, which the engine reads once a step
without a sync (check_error_flags, EngramTables.check_errors)."""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.memory import registration
from engram.memory.mapping import map_anonymous
from engram.ops import DEAD_ID, HASHERS, LAUNCHERS, OUT_KINDS, cpu, gather, kernel_ids
from engram.ops.build import KERNELS, build_library
from engram.ops.checks import GatherCall, HashCall, row_format
from engram.ops.segments import dense
from engram.user_cache import load_library

_VP, _I64, _I64P = ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64)
_U64P = ctypes.POINTER(ctypes.c_uint64)
SIGNATURES: dict[str, list[type]] = {
    "engram_gather_cuda": [
        _VP,
        _VP,
        _I64,
        _I64,
        _I64,
        _I64,
        _I64,
        _VP,
        _VP,
        _VP,
        _I64,
        _VP,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_float,
        _VP,
        ctypes.c_int,
        _VP,
    ],
    "engram_check_ids_cuda": [_VP, _I64, _I64, _I64, _VP, _VP],
    "engram_ngram_hash_cuda": [_VP, _VP, _I64, _I64, _VP, _VP, _VP, _VP, _I64, _I64, _I64, _I64, _VP, _VP],
    "engram_host_register": [_VP, ctypes.c_uint64, ctypes.c_uint],
    "engram_host_unregister": [_VP],
    "engram_host_get_device_pointer": [ctypes.POINTER(ctypes.c_void_p), _VP],
    "engram_pointer_memory_type": [ctypes.POINTER(ctypes.c_int), _VP],
    "engram_device_attribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "engram_cuda_get_last_error": [],
    "engram_cuda_last_error": [],
    "engram_host_numa_map": [
        ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int, _U64P, _U64P, _U64P, ctypes.POINTER(ctypes.c_int),
        ctypes.POINTER(ctypes.c_int),
    ],
    "engram_host_numa_unmap": [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64],
}  # fmt: skip
# Always built; newer ones are added when the toolkit knows them (Hopper is sm_90, the H200 too).
BASE_ARCHS = ("80", "90")
EXTRA_ARCHS = ("100", "120")


def gencode_flags(nvcc: str = "nvcc") -> list[str]:
    try:
        listed = subprocess.run(
            [nvcc, "--list-gpu-arch"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    known = set(re.findall(r"compute_(\d+)", listed))
    archs = [*BASE_ARCHS, *(a for a in EXTRA_ARCHS if a in known)]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    return [*flags, f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"]  # PTX for newer GPUs


def build(nvcc: str | None = None) -> Path:
    """Compile every .cu with warnings as errors; returns the cached library's path."""
    compiler = nvcc or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    flags = [
        "-O3",
        "-std=c++17",
        "-shared",
        "-Werror",
        "all-warnings",
        "-Xcompiler",
        "-Wall,-Wextra,-Werror,-fPIC",
        *gencode_flags(compiler),
    ]
    return build_library("engram_cuda", sorted(KERNELS.glob("*.cu")), compiler, flags)


def load(path: Path) -> ctypes.CDLL:
    """Open a kernel library and declare its C ABI (a stub with the same symbols loads the same way)."""
    try:
        library = load_library(path)
    except EngramError as exc:
        raise EngramError(f"cannot load the CUDA kernels: {exc}") from None
    cpu.bind(library, SIGNATURES)
    library.engram_cuda_error_string.argtypes = [ctypes.c_int]
    library.engram_cuda_error_string.restype = ctypes.c_char_p
    return library


@functools.cache
def cuda_library() -> ctypes.CDLL:
    return load(build())


def check(library: ctypes.CDLL, status: int, what: str) -> None:
    """Raise for a non-zero status, naming the CUDA error behind ENGRAM_ERR_CUDA."""
    if status == 3:
        code = library.engram_cuda_last_error()
        text = library.engram_cuda_error_string(code).decode(errors="replace")
        raise EngramError(f"{what} failed: CUDA error {code} ({text})")
    cpu.check(status, what)


class LibraryRuntime:
    """host_numa.HostNumaRuntime (registration.CudaRuntime and the host-NUMA cuMem calls) over the kernel
    library's wrappers of cudaHostRegister and friends."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self.library = library

    def host_register(self, addr: int, size: int, flags: int) -> int:
        return int(self.library.engram_host_register(addr, size, flags))

    def host_unregister(self, addr: int) -> int:
        return int(self.library.engram_host_unregister(addr))

    def host_get_device_pointer(self, addr: int) -> tuple[int, int]:
        pointer = ctypes.c_void_p(0)
        code = int(self.library.engram_host_get_device_pointer(ctypes.byref(pointer), addr))
        return code, int(pointer.value or 0)

    def pointer_memory_type(self, addr: int) -> tuple[int, int]:
        kind = ctypes.c_int(0)
        code = int(self.library.engram_pointer_memory_type(ctypes.byref(kind), addr))
        return code, int(kind.value)

    def device_attribute(self, attribute: int) -> tuple[int, int]:
        value = ctypes.c_int(0)
        code = int(self.library.engram_device_attribute(ctypes.byref(value), attribute, -1))  # -1: current GPU
        return code, int(value.value)

    def get_last_error(self) -> int:
        return int(self.library.engram_cuda_get_last_error())

    def host_numa_map(self, size: int, chunk: int, node: int) -> tuple[int, int, int, int, int]:
        """engram_host_numa_map: (CUresult, address, padded bytes, page size, the step that failed)."""
        addr, padded, granule = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        used, step = ctypes.c_int(), ctypes.c_int()
        code = int(
            self.library.engram_host_numa_map(
                size, chunk, node, ctypes.byref(addr), ctypes.byref(padded), ctypes.byref(granule),
                ctypes.byref(used), ctypes.byref(step),
            )
        )  # fmt: skip
        return code, addr.value, padded.value, granule.value, step.value

    def host_numa_unmap(self, addr: int, length: int, chunk: int) -> int:
        return int(self.library.engram_host_numa_unmap(addr, length, chunk))

    def error_string(self, code: int) -> str:
        return str(self.library.engram_cuda_error_string(code).decode(errors="replace"))


def check_readable(runtime: registration.CudaRuntime, *tables: torch.Tensor | None) -> None:
    """Host tables must be registered for the GPU to read them (the driver's word, not torch's)."""
    for name, table in zip(("weight", "scale"), tables, strict=False):
        if table is None or table.device.type != "cpu" or not table.numel():
            continue
        if not registration.is_registered(runtime, table.data_ptr(), table.numel() * table.element_size()):
            raise EngramError(
                f"the {name} table is in host memory the CUDA driver does not report as registered: the GPU cannot read it (allocate it through engram.runtime.placement.storage, or keep it on the device)"
            )


PROBE_ROWS, PROBE_ROW_BYTES = 4096, 256  # 1 MiB


def uva_probe(runtime: registration.CudaRuntime, device: torch.device | str = "cuda") -> str:
    """Register 1 MiB of host memory and gather scattered rows of it on `device` through its UVA address:
    what every host table placement relies on. Returns what was read; raises EngramError naming the
    step that failed."""
    mapping = map_anonymous(PROBE_ROWS * PROBE_ROW_BYTES, kind="pinned")
    table = mapping.view(0, (PROBE_ROWS, PROBE_ROW_BYTES), torch.uint8)
    try:
        table.copy_(torch.randint(0, 256, table.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(7)))
        registration.register(mapping, runtime)
        ids = torch.randperm(PROBE_ROWS, generator=torch.Generator().manual_seed(8))[:1024]
        read = gather(table, None, ids.to(device), 0, PROBE_ROWS, torch.uint8).cpu()
        if not torch.equal(read, table[ids]):
            raise EngramError("rows read from the GPU through UVA differ from host memory")
        return f"registered {mapping.length >> 20} MiB of host memory and read {ids.numel()} scattered rows of it on {device} through UVA, bit for bit"
    finally:
        del table
        mapping.release()


# What each slot of a device's error flag reports; the kernels set a slot to 1 and the host clears it.
FLAG_ROW_ID, FLAG_TOKEN_ID = 0, 1
FLAG_MESSAGES = (
    "a gather on {device} was given a row id outside its table (it read zeros instead)",
    "the n-gram hash on {device} was given a compressed token id outside the vocabulary (its row ids are meaningless); compress raw token ids first",
)
# One flag per GPU index, made by error_flag and never freed: captured graphs keep writing to its address.
_flags: dict[int, torch.Tensor] = {}


def _index(device: torch.device | str) -> int:
    device = torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def error_flag(device: torch.device | str) -> torch.Tensor:
    """Where the kernels on `device` report bad input: int32 slots (FLAG_ROW_ID, FLAG_TOKEN_ID) in pinned
    host memory, which the kernels write through its UVA address (a plain store: a slot only goes from 0 to
    1) and the host reads without synchronising. The address is fixed, so captured graphs report there
    too. Make it before any capture (EngramTables.build does): pinning memory is no capturable step."""
    index = _index(device)
    if index not in _flags:
        # host memory whatever the default device (engines build models under `with torch.device("cuda")`)
        _flags[index] = torch.zeros(len(FLAG_MESSAGES), dtype=torch.int32, device="cpu", pin_memory=True)
    return _flags[index]


def check_error_flags(*, after: torch.cuda.Event | None = None) -> None:
    """Raise (and clear the flag) if a kernel on any GPU of this process was given bad input since the last
    check: eager calls, prefetches and graph replays alike. The flags cover the work finished so far:
    `after`, an event recorded behind the work to cover, is waited for first, except while a stream
    captures (waiting is not permitted then: the flags are read as they stand)."""
    if after is not None and not torch.cuda.is_current_stream_capturing():
        after.synchronize()
    for index, flag in _flags.items():
        raised = [slot for slot in range(len(FLAG_MESSAGES)) if int(flag[slot])]
        if raised:
            flag.zero_()
            raise EngramError(FLAG_MESSAGES[raised[0]].format(device=f"cuda:{index}"))


_max_blocks: contextvars.ContextVar[int] = contextvars.ContextVar("engram_max_blocks", default=0)


@contextlib.contextmanager
def limit_blocks(blocks: int) -> Iterator[None]:
    """Gathers launched inside use at most `blocks` thread blocks (0: no cap): a lookup running beside
    the model's compute (EngramTables.prefetch) then leaves it the rest of the GPU."""
    if blocks < 0:
        raise EngramError(f"a block cap must be at least 0 (0: no cap), got {blocks}")
    token = _max_blocks.set(blocks)
    try:
        yield
    finally:
        _max_blocks.reset(token)


@functools.cache
def library_runtime() -> LibraryRuntime:
    return LibraryRuntime(cuda_library())


def _stream(device: torch.device) -> int:
    return int(torch.cuda.current_stream(device).cuda_stream)


def launch_cuda(call: GatherCall) -> None:
    """The CUDA kernel on the ids' device and its current stream, arguments already checked
    (ops.dispatch.run_gather). Nothing here synchronises: ids outside the table read zeros and raise the
    device's error flag, which the engine reads once a step (EngramTables.check_errors)."""
    ids, out = call.ids, call.out
    assert isinstance(out, torch.Tensor)  # run_gather gives the kernels a buffer
    weight, scale = dense(call.weight), None if call.scale is None else dense(call.scale)
    check_readable(library_runtime(), weight, scale)
    library = cuda_library()
    flag = error_flag(ids.device)
    with torch.cuda.device(ids.device):  # the launch goes to the ids' GPU, whichever is current
        stream = _stream(ids.device)
        if call.check is not None:
            more = call.check.reshape(-1).to(torch.int64).contiguous()
            row_flag = flag_slot(flag, FLAG_ROW_ID)
            status = library.engram_check_ids_cuda(
                more.data_ptr() or None, more.numel(), DEAD_ID, call.table_rows, row_flag, stream
            )
            check(library, status, "engram_check_ids_cuda")
        flat, order, leader = kernel_ids(ids, call.sorted)
        gather_cuda(
            library,
            weight,
            scale,
            flat,
            order,
            leader,
            call.row_start,
            call.table_rows,
            out,
            flag,
            _max_blocks.get(),
            call.table_scale,
        )


LAUNCHERS["cuda"] = launch_cuda


def flag_slot(flag: torch.Tensor, slot: int) -> int:
    """The address of one slot of an error flag (error_flag), as the kernels take it."""
    return flag.data_ptr() + slot * flag.element_size()


def gather_cuda(
    library: ctypes.CDLL,
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    order: torch.Tensor | None,
    leader: torch.Tensor | None,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
    flag: torch.Tensor,
    max_blocks: int = 0,
    table_scale: float | None = None,
    stream: int | None = None,
) -> None:
    """engram_gather_cuda on `stream` (default: the ids' device's current one), for ids as ops.kernel_ids
    gives them: the one place that spells out the C ABI call (the op, scripts/gpu_check.py's raw kernel
    checks and the emulated kernels' tests all use it)."""
    quant, dim = row_format(weight, scale, table_scale)
    status = library.engram_gather_cuda(
        weight.data_ptr() or None, scale.data_ptr() if scale is not None and scale.numel() else None, weight.shape[0], dim,
        weight.shape[1] * weight.element_size(), row_start, table_rows, ids.data_ptr() or None,
        None if order is None else order.data_ptr(), None if leader is None else leader.data_ptr(), ids.numel(),
        out.data_ptr() or None, 0 if quant is None else OUT_KINDS[out.dtype], quant or 0,
        1.0 if table_scale is None else table_scale, flag.data_ptr(), max_blocks,
        _stream(ids.device) if stream is None else stream,
    )  # fmt: skip
    check(library, status, "engram_gather_cuda")


def hash_cuda(call: HashCall) -> None:
    """The hash on the ids' GPU; new token ids outside [0, vocab) raise the flag's FLAG_TOKEN_ID slot (no sync)."""
    library = cuda_library()
    ext = call.ext
    layers, max_ngram = call.multipliers.shape
    tokens, context = call.start.numel(), ext.numel() - call.start.numel()
    with torch.cuda.device(ext.device):
        stream = _stream(ext.device)
        new = ext.data_ptr() + context * ext.element_size() if tokens else None
        flag = flag_slot(error_flag(ext.device), FLAG_TOKEN_ID)
        check(library, library.engram_check_ids_cuda(new, tokens, 0, call.vocab, flag, stream), "engram_check_ids_cuda")
        status = library.engram_ngram_hash_cuda(
            ext.data_ptr(), call.start.data_ptr(), tokens, context, call.multipliers.data_ptr(), call.primes.data_ptr(),
            call.magic.data_ptr(), call.offsets.data_ptr(), layers, max_ngram, call.primes.shape[1] // (max_ngram - 1),
            call.fill, call.out.data_ptr(), stream,
        )  # fmt: skip
        check(library, status, "engram_ngram_hash_cuda")


HASHERS["cuda"] = hash_cuda

__all__ = ["DEAD_ID", "LibraryRuntime", "build", "check_error_flags", "cuda_library", "error_flag", "load", "uva_probe"]
