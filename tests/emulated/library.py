"""The CUDA kernels' own .cu files built for the host (kernels/emulate/cuda_runtime.h stands in for the CUDA
runtime and runs each launch as a loop over its grid), under AddressSanitizer, loaded through the same
C ABI declarations as the real library (engram.ops.cuda.load); and the RAM tier's index (a CPU kernel with
no OpenMP or signal handling) built under it too, bound as engram.ops.cpu binds the real one."""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess

from engram.ops import cpu, cuda
from engram.ops.build import KERNELS, build_library

COMPILER = os.environ.get("CXX", "g++")
FLAGS = [
    "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
    f"-I{KERNELS / 'emulate'}", f"-I{KERNELS}", "-x", "c++",
]  # fmt: skip


def asan_runtime() -> str | None:
    """The compiler's AddressSanitizer runtime, which must be loaded first (LD_PRELOAD) into the process
    that loads the emulated library; None when the compiler has none."""
    if shutil.which(COMPILER) is None:
        return None
    done = subprocess.run([COMPILER, "-print-file-name=libasan.so"], capture_output=True, text=True, timeout=60)
    path = done.stdout.strip()
    return path if done.returncode == 0 and os.path.isabs(path) and os.path.exists(path) else None


@functools.cache
def emulated() -> ctypes.CDLL:
    sources = sorted(KERNELS.glob("*.cu"))
    return cuda.load(build_library("engram_cuda_emulated", sources, COMPILER, FLAGS))


C_COMPILER = os.environ.get("CC", "cc")
C_FLAGS = [
    "-std=c11", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror",
]  # fmt: skip
TIER_FUNCTIONS = ("engram_tier_find", "engram_tier_insert", "engram_tier_remove", "engram_clock_sweep")


@functools.cache
def sanitized_tier() -> ctypes.CDLL:
    """kernels/cpu/tier_cpu.c and direct_cpu.c (the RAM tier's index and its reads past the page cache)
    under AddressSanitizer, their functions declared as engram.ops.cpu declares them."""
    sources = [KERNELS / "cpu" / "tier_cpu.c", KERNELS / "cpu" / "direct_cpu.c"]
    library = ctypes.CDLL(str(build_library("engram_tier_asan", sources, C_COMPILER, C_FLAGS)))
    return cpu.bind(library, {name: cpu.SIGNATURES[name] for name in (*TIER_FUNCTIONS, "engram_read_direct_cpu")})
