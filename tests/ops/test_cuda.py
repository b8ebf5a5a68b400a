"""The CUDA half without a GPU: every .cu compiles with nvcc for sm_90 with no warnings, and the ctypes
loading path and error handling work against a stub library with the same C ABI."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from engram.errors import EngramError
from engram.memory.mapping import map_anonymous
from engram.memory.registration import register
from engram.ops import cuda
from engram.ops.build import build_library

SYMBOLS = [*cuda.SIGNATURES, "engram_cuda_error_string"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (the CUDA toolkit) is not installed")
def test_nvcc_builds_every_kernel_without_warnings() -> None:
    flags = cuda.gencode_flags()
    assert "-gencode=arch=compute_90,code=sm_90" in flags and "-gencode=arch=compute_80,code=sm_80" in flags
    path = cuda.build()  # -Werror all-warnings: any warning fails the build
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    for symbol in SYMBOLS:
        assert f" T {symbol}\n" in exported
    if shutil.which("cuobjdump"):  # not in every toolkit install (this machine's lacks it)
        listing = subprocess.run(
            ["cuobjdump", "--list-elf", str(path)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        assert "sm_90" in listing


@pytest.fixture(scope="module")
def stub() -> ctypes.CDLL:
    source = Path(__file__).with_name("stub_cuda.c")
    path = build_library("engram_stub", [source], "cc", ["-O1", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"])
    library = cuda.load(path)
    library.stub_set.argtypes = [ctypes.c_int] * 4
    library.stub_lie.argtypes = [ctypes.c_int]
    return library


def test_status_codes(stub: ctypes.CDLL) -> None:
    stub.stub_set(0, 0, 0, 0)
    cuda.check(
        stub,
        stub.engram_gather_cuda(None, None, 0, 1, 1, 0, 0, None, None, None, 0, None, 0, 0, 1.0, None, 0, None),
        "gather",
    )
    stub.stub_set(3, 2, 0, 0)
    with pytest.raises(EngramError, match=r"^engram_gather_cuda failed: CUDA error 2 \(out of memory\)$"):
        cuda.check(
            stub,
            stub.engram_gather_cuda(None, None, 0, 1, 1, 0, 0, None, None, None, 0, None, 0, 0, 1.0, None, 0, None),
            "engram_gather_cuda",
        )
    stub.stub_set(1, 0, 0, 0)
    with pytest.raises(EngramError, match=r"^engram_ngram_hash_cuda failed: invalid argument$"):
        cuda.check(
            stub,
            stub.engram_ngram_hash_cuda(None, None, 0, 0, None, None, None, None, 1, 2, 1, 0, None, None),
            "engram_ngram_hash_cuda",
        )
    stub.stub_set(2, 0, 0, 0)
    with pytest.raises(EngramError, match="id outside the table"):
        cuda.check(stub, 2, "gather")


def test_registration_through_the_library(stub: ctypes.CDLL) -> None:
    runtime = cuda.LibraryRuntime(stub)
    stub.stub_set(0, 0, 0, 0)
    mapping = map_anonymous(3 * 4096)
    assert register(mapping, runtime, chunk_bytes=4096) == mapping.addr
    assert stub.stub_registered() == 3
    mapping.release()
    assert stub.stub_registered() == 0
    stub.stub_set(0, 0, 2, 0)
    failing = map_anonymous(4096)
    with pytest.raises(
        EngramError, match=r"cudaHostRegister of 4,096 bytes at offset 0 failed: out of memory \(error 2\)"
    ):
        register(failing, runtime)
    assert runtime.get_last_error() == 0  # the failed call's error was cleared
    stub.stub_set(0, 0, 0, 1)
    with pytest.raises(EngramError, match=r"cudaHostGetDevicePointer failed: invalid argument \(error 1\)"):
        register(failing, runtime)
    assert stub.stub_registered() == 0  # the chunk registered before the failure was undone


def test_host_tables_readable_by_the_gpu_per_the_driver(stub: ctypes.CDLL) -> None:
    """The CUDA gather asks the driver (pointer attributes) whether a host table is registered."""
    runtime = cuda.LibraryRuntime(stub)
    stub.stub_set(0, 0, 0, 0)
    mapping = map_anonymous(4096)
    table = mapping.view(0, (64, 64), torch.uint8)
    with pytest.raises(
        EngramError, match="the weight table is in host memory the CUDA driver does not report as registered"
    ):
        cuda.check_readable(runtime, table, None)
    register(mapping, runtime)
    cuda.check_readable(runtime, table, None)
    cuda.check_readable(runtime, torch.empty(0), None)  # nothing to read
    stub.stub_lie(1)
    cuda.check_readable(runtime, None, table)  # known registered through this runtime: no driver call
    with pytest.raises(EngramError, match="the scale table is in host memory"):
        cuda.check_readable(cuda.LibraryRuntime(stub), None, table)  # another runtime asks the driver
    stub.stub_lie(0)
    del table
    mapping.release()
    assert stub.stub_registered() == 0


def test_doctor_uva_check_registers_and_reads(stub: ctypes.CDLL) -> None:
    """engram doctor's UVA check really registers a buffer and reads it back (here through the stub
    runtime and the CPU gather; on a GPU through the driver and the CUDA kernel), and says how to fix
    a failed registration."""
    from engram.apps.doctor import check_uva

    runtime = cuda.LibraryRuntime(stub)
    stub.stub_set(0, 0, 0, 0)
    passed = check_uva(runtime, device="cpu")
    assert (passed.name, passed.status) == ("UVA", "pass")
    assert (
        passed.detail
        == "registered 1 MiB of host memory and read 1024 scattered rows of it on cpu through UVA, bit for bit"
    )
    assert stub.stub_registered() == 0  # unregistered again
    stub.stub_set(0, 0, 2, 0)  # cudaHostRegister: out of memory (the memlock limit, typically)
    failed = check_uva(runtime, device="cpu")
    assert (
        failed.status == "fail"
        and "cudaHostRegister of 1,048,576 bytes at offset 0 failed: out of memory" in failed.detail
    )
    assert "ulimit -l unlimited" in failed.fix and runtime.get_last_error() == 0
    stub.stub_set(0, 0, 0, 0)
    stub.stub_lie(1)
    lied = check_uva(runtime, device="cpu")
    stub.stub_lie(0)
    assert lied.status == "fail" and "does not see the 1,048,576 bytes" in lied.detail
    assert stub.stub_registered() == 0


def test_missing_library(tmp_path: Path) -> None:
    with pytest.raises(
        EngramError,
        match=r"cannot load the CUDA kernels: cannot open the kernel library .*libnothing\.so: No such file",
    ):
        cuda.load(tmp_path / "libnothing.so")


def test_gpu_check_says_it_needs_a_gpu() -> None:
    """Without a GPU the check refuses plainly (it runs in full on a GPU machine)."""
    import sys

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: run scripts/gpu_check.py itself")
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "gpu_check: no CUDA device here; run it on a GPU machine\n"


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.py covers this on a GPU machine)"
)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", ["fp8", "bf16"])
@pytest.mark.parametrize("placement", ["device", "pinned"])
@pytest.mark.parametrize("sorted_form", [False, True])
def test_cuda_gather_equals_cpu(dtype: str, placement: str, sorted_form: bool) -> None:
    from engram.ops import gather, gather_reference
    from engram.runtime.placement.storage import allocate
    from engram.runtime.shard import ShardFormat

    runtime = cuda.library_runtime() if placement == "pinned" else None
    shard = allocate("t", ShardFormat(300, 64, dtype), placement, row_start=100, runtime=runtime, device="cuda")  # type: ignore[arg-type]
    shard.weight.view(torch.uint8).copy_(torch.randint(0, 120, shard.weight.view(torch.uint8).shape, dtype=torch.uint8))
    if shard.scale is not None:
        shard.scale.view(torch.uint8).fill_(120)
    ids = torch.randint(-1, 500, (77, 5))
    out_dtype = torch.bfloat16
    ids[3] = ids[5]  # duplicates for the sorted form
    got = gather(shard.weight, shard.scale, ids.cuda(), 100, 500, out_dtype, sorted_form)
    want = gather_reference(
        shard.weight.cpu(), None if shard.scale is None else shard.scale.cpu(), ids, 100, 500, out_dtype
    )
    assert torch.equal(got.cpu(), want)
    cuda.check_error_flags()  # nothing flagged so far
    ids[0, 0] = 500  # outside the table: zeros and the pinned flag, no exception and no sync in the call
    bad = gather(shard.weight, shard.scale, ids.cuda(), 100, 500, out_dtype, sorted_form)
    torch.cuda.synchronize()
    assert not bad.cpu()[0, 0].any()
    with pytest.raises(EngramError, match="a gather on cuda:0 was given a row id outside its table"):
        cuda.check_error_flags()
    cuda.check_error_flags()  # cleared


@pytest.mark.gpu
@needs_gpu
def test_cuda_hash_equals_cpu() -> None:
    from engram.apps.presets import get_preset

    hasher = get_preset("deepseek-v4.1-flash").hasher()
    ids = torch.randint(0, 99_092, (1000,))
    assert torch.equal(hasher.hash(ids.cuda()).cpu(), hasher.hash(ids))


def test_block_cap_is_scoped() -> None:
    assert cuda._max_blocks.get() == 0
    with cuda.limit_blocks(12):
        assert cuda._max_blocks.get() == 12
        with cuda.limit_blocks(0):
            assert cuda._max_blocks.get() == 0
        assert cuda._max_blocks.get() == 12
    assert cuda._max_blocks.get() == 0
    with (
        pytest.raises(EngramError, match=r"a block cap must be at least 0 \(0: no cap\), got -1"),
        cuda.limit_blocks(-1),
    ):
        pass


def test_the_read_only_registration_attribute_is_asked_of_the_library(stub: ctypes.CDLL) -> None:
    stub.stub_set_read_only.argtypes = [ctypes.c_int]
    runtime = cuda.LibraryRuntime(stub)
    assert runtime.device_attribute(113) == (0, 1)
    stub.stub_set_read_only(0)
    assert runtime.device_attribute(113) == (0, 0)
    stub.stub_set_read_only(1)
