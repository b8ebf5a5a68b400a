"""GPU registration logic against a fake CUDA runtime: chunking, error codes, clearing, unregistering."""

from __future__ import annotations

import gc

import pytest
import torch

from engram.errors import EngramError
from engram.memory.mapping import map_anonymous
from engram.memory.registration import (
    CHUNK_BYTES,
    is_registered,
    register,
)
from engram.runtime.placement.storage import allocate
from engram.runtime.shard import ShardFormat
from tests.memory.fakes import FakeRuntime


def test_chunks_and_unregisters_on_release() -> None:
    mapping = map_anonymous(10 * 4096)
    runtime = FakeRuntime()
    pointer = register(mapping, runtime, chunk_bytes=3 * 4096)
    assert pointer == mapping.addr
    sizes = [c[2] for c in runtime.calls if c[0] == "register"]
    assert sizes == [3 * 4096, 3 * 4096, 3 * 4096, 4096]
    assert all(c[3] == 3 for c in runtime.calls if c[0] == "register")  # portable | mapped
    assert mapping.release() is True
    assert runtime.registered == {}
    assert [c[0] for c in runtime.calls[-4:]] == ["unregister"] * 4


def test_real_chunk_limit_is_64_gib() -> None:
    assert CHUNK_BYTES == 64 << 30


def test_failed_register_clears_error_and_undoes() -> None:
    mapping = map_anonymous(8 * 4096)
    runtime = FakeRuntime(fail_register_at=2)
    with pytest.raises(
        EngramError, match=r"cudaHostRegister of 8,192 bytes at offset 16,384 failed: out of memory \(error 2\)"
    ):
        register(mapping, runtime, chunk_bytes=2 * 4096)
    assert runtime.sticky == 0 and ("get_last_error", 2) in runtime.calls
    assert runtime.registered == {}
    mapping.release()


def test_failed_device_pointer() -> None:
    mapping = map_anonymous(4096)
    runtime = FakeRuntime(fail_pointer=True)
    with pytest.raises(EngramError, match="cudaHostGetDevicePointer failed: invalid argument"):
        register(mapping, runtime)
    assert runtime.registered == {} and runtime.sticky == 0


@pytest.mark.parametrize(("base", "gap"), [(1 << 40, 0), (None, 4096)])
def test_device_view_must_be_the_host_address(base: int | None, gap: int) -> None:
    mapping = map_anonymous(4 * 4096)
    runtime = FakeRuntime(device_base=base, gap=gap)
    with pytest.raises(EngramError, match="maps registered host memory at other addresses"):
        register(mapping, runtime, chunk_bytes=2 * 4096)
    assert runtime.registered == {}


def test_gc_unregisters() -> None:
    runtime = FakeRuntime()
    mapping = map_anonymous(4096)
    register(mapping, runtime)
    del mapping
    gc.collect()
    assert runtime.registered == {}


def test_registration_is_confirmed_by_the_driver() -> None:
    mapping = map_anonymous(5 * 4096)
    runtime = FakeRuntime(lie=True)
    with pytest.raises(EngramError, match="reported success but the CUDA driver does not see the 20,480 bytes"):
        register(mapping, runtime, chunk_bytes=2 * 4096)
    assert runtime.registered == {}  # every chunk undone
    assert not is_registered(FakeRuntime(), mapping.addr, mapping.length)  # never registered at all
    mapping.release()


def test_a_gap_between_chunks_is_caught() -> None:
    mapping = map_anonymous(6 * 4096)
    runtime = FakeRuntime()
    register(mapping, runtime, chunk_bytes=2 * 4096)
    driver = FakeRuntime()  # another runtime: it asks the driver instead of trusting the registry
    driver.registered = dict(runtime.registered)
    assert is_registered(driver, mapping.addr, mapping.length, chunk_bytes=2 * 4096)
    del driver.registered[mapping.addr + 2 * 4096]  # the middle chunk lost
    assert not is_registered(driver, mapping.addr, mapping.length, chunk_bytes=2 * 4096)
    assert is_registered(runtime, mapping.addr + 4096, 4096)  # inside a mapping registered through it
    mapping.release()
    assert runtime.registered == {} and not is_registered(runtime, mapping.addr, 4096)


@pytest.mark.parametrize("placement", ["pinned", "hugepages"])
def test_host_tables_start_before_torch_initialises_cuda(monkeypatch: pytest.MonkeyPatch, placement: str) -> None:
    """The H200 regression: registration succeeded while Tensor.is_pinned() said False because torch had
    not created its CUDA context yet, and allocate refused every host placement. The driver's pointer
    attributes decide now, so the shard is allocated, registered and readable."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, device=None: False)
    runtime = FakeRuntime()
    shard = allocate("layers.2.engram.embed", ShardFormat(1000, 64, "fp8"), placement, runtime=runtime)  # type: ignore[arg-type]
    assert shard.device_pointer == shard.mapping.addr  # type: ignore[union-attr]
    assert is_registered(runtime, shard.weight.data_ptr(), shard.weight.numel())
    shard.release()
    assert runtime.registered == {}
    liar = FakeRuntime(lie=True)
    with pytest.raises(EngramError, match=r"does not see the .* bytes .* as page-locked host memory"):
        allocate("t", ShardFormat(1000, 64, "fp8"), placement, runtime=liar)  # type: ignore[arg-type]
    assert liar.registered == {}


def test_a_refused_read_only_registration_names_the_real_cause() -> None:
    """cudaErrorNotSupported for a read-only registration is the GPU's limit, not `ulimit -l`."""
    mapping = map_anonymous(1 << 20)
    runtime = FakeRuntime(read_only=0)
    with pytest.raises(EngramError) as raised:
        register(mapping, runtime, read_only=True)
    assert str(raised.value) == (
        f"cudaHostRegister of {1 << 20:,} bytes at offset 0 failed: operation not supported (error 801); this GPU or "
        "driver cannot register read-only host memory: serve file-backed tables from a checkpoint on disk "
        "(gathered on host threads), or drop file_backed"
    )
    assert runtime.registered == {} and runtime.sticky == 0
    mapping.release()
