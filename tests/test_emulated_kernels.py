"""The CUDA kernels' own source, run on the CPU under AddressSanitizer (tests/emulated): a child process
with the sanitizer's runtime preloaded runs tests/emulated/cases.py, and any failing case or any
out-of-bounds access fails this test with the child's report. The child starts as soon as collection
ends (tests/conftest.py), so it runs beside the rest of the suite on the second core."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.emulated.library import asan_runtime
from tests.emulated.run import EmulatedRun, started


def test_the_cuda_kernels_run_emulated_and_bounds_checked() -> None:
    runtime = asan_runtime()
    if runtime is None:
        pytest.skip("the emulated kernels need a C++ compiler with AddressSanitizer (g++)")
    code, report = (started.pop() if started else EmulatedRun(runtime)).finish()
    found = [
        line
        for line in report.splitlines()
        if "Sanitizer" in line or "runtime error" in line or line.startswith("FAILED")
    ]
    assert code == 0, "\n".join([*found[:20], report[-4000:]])
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
