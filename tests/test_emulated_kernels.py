"""The CUDA kernels' own source, run on the CPU under AddressSanitizer (tests/emulated): a child process
with the sanitizer's runtime preloaded runs tests/emulated/cases.py, and any failing case or any
out-of-bounds access fails this test with the child's report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.emulated.library import asan_runtime

ROOT = Path(__file__).resolve().parents[1]


def test_the_cuda_kernels_run_emulated_and_bounds_checked() -> None:
    runtime = asan_runtime()
    if runtime is None:
        pytest.skip("the emulated kernels need a C++ compiler with AddressSanitizer (g++)")
    env = {
        **os.environ,
        "LD_PRELOAD": runtime,
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=97",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "--capture=sys", str(ROOT / "tests/emulated/cases.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    report = done.stdout + done.stderr
    found = [
        line
        for line in report.splitlines()
        if "Sanitizer" in line or "runtime error" in line or line.startswith("FAILED")
    ]
    assert done.returncode == 0, "\n".join([*found[:20], report[-4000:]])
    assert "ERROR: AddressSanitizer" not in report and "runtime error" not in report


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("__shared__ int cache[32]; cache[threadIdx.x] = 1;", "cannot run a kernel with __shared__ memory"),
        ("__syncthreads();", "cannot run __syncthreads()"),
    ],
)
def test_a_kernel_the_emulator_cannot_run_exactly_is_refused_at_compile_time(
    body: str, message: str, tmp_path: Path
) -> None:
    from tests.emulated.library import COMPILER, FLAGS

    if asan_runtime() is None:
        pytest.skip("needs a C++ compiler (g++)")
    source = tmp_path / "k.cu"
    source.write_text(f"#include <cuda_runtime.h>\n__global__ void k() {{ {body} }}\n")
    done = subprocess.run(
        [COMPILER, *FLAGS, "-c", str(source), "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0 and message in done.stderr
