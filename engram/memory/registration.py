"""Pin host mappings for the GPU: cudaHostRegister in chunks of at most 64 GiB (single registrations of
512 GiB and more fail on current drivers), a UVA device pointer, and unregistration before unmapping.
Every return code is checked, and a failed call's sticky error is cleared so it cannot surface later in
an unrelated CUDA call. The runtime is injected, so the logic is tested without a GPU."""

from __future__ import annotations

import functools
from typing import Protocol

from engram.errors import EngramError
from engram.memory.mapping import Mapping

CHUNK_BYTES = 64 << 30
HOST_REGISTER_PORTABLE = 1
HOST_REGISTER_MAPPED = 2
HOST_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly
MEMORY_TYPE_HOST = 1  # cudaMemoryTypeHost: page-locked host memory, readable by the GPU
# cudaDevAttrHostRegisterReadOnlySupported: 1 where cudaHostRegisterReadOnly works. Many x86 hosts
# report 0, and the flag then fails with cudaErrorNotSupported.
ATTRIBUTE_READ_ONLY_REGISTER = 113
ERROR_NOT_SUPPORTED = 801
# Mappings this process registered and has not unregistered yet, (addr, length) -> the runtime that did:
# a lookup checks its tables here (microseconds) before asking the driver.
_live: dict[tuple[int, int], CudaRuntime] = {}


class CudaRuntime(Protocol):
    """The few CUDA runtime calls registration needs; each returns a cudaError_t (0 is success)."""

    def host_register(self, addr: int, size: int, flags: int) -> int: ...
    def host_unregister(self, addr: int) -> int: ...
    def host_get_device_pointer(self, addr: int) -> tuple[int, int]: ...
    def pointer_memory_type(self, addr: int) -> tuple[int, int]: ...
    def device_attribute(self, attribute: int) -> tuple[int, int]: ...
    def get_last_error(self) -> int: ...
    def error_string(self, code: int) -> str: ...


def read_only_supported(runtime: CudaRuntime) -> bool:
    """Whether the current GPU can register read-only host memory (a PROT_READ file mapping)."""
    code, value = runtime.device_attribute(ATTRIBUTE_READ_ONLY_REGISTER)
    if code != 0:
        runtime.get_last_error()  # clear it: a failed query must not surface in a later CUDA call
        return False
    return value == 1


def register(mapping: Mapping, runtime: CudaRuntime, *, chunk_bytes: int = CHUNK_BYTES, read_only: bool = False) -> int:
    """Register `mapping` and return its device pointer (its own address: unified addressing is required);
    unregistration runs when it is released. `read_only` for a PROT_READ mapping (a file-backed table):
    the pages are pinned without asking for write access."""
    done: list[int] = []
    key = (mapping.addr, mapping.length)  # never the mapping itself: its release hooks must not keep it alive

    def undo() -> None:
        _live.pop(key, None)
        for addr in reversed(done):
            if runtime.host_unregister(addr) != 0:
                runtime.get_last_error()
        done.clear()

    def fail(what: str, code: int) -> EngramError:
        runtime.get_last_error()  # clear the sticky error before anything else runs
        undo()
        fix = (
            "this GPU or driver cannot register read-only host memory: serve file-backed tables from a checkpoint on disk (gathered on host threads), or drop file_backed"
            if read_only and code == ERROR_NOT_SUPPORTED
            else "check `ulimit -l` and free memory, or set cpu_offload=false"
        )
        return EngramError(f"{what} failed: {runtime.error_string(code)} (error {code}); {fix}")

    for offset in range(0, mapping.length, chunk_bytes):
        size = min(chunk_bytes, mapping.length - offset)
        flags = HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED | (HOST_REGISTER_READ_ONLY if read_only else 0)
        code = runtime.host_register(mapping.addr + offset, size, flags)
        if code != 0:
            raise fail(f"cudaHostRegister of {size:,} bytes at offset {offset:,}", code)
        done.append(mapping.addr + offset)
        code, pointer = runtime.host_get_device_pointer(mapping.addr + offset)
        if code != 0:
            raise fail("cudaHostGetDevicePointer", code)
        if pointer != mapping.addr + offset:
            # The kernels read host tables through their host addresses (unified addressing); a GPU
            # that maps registered memory elsewhere cannot serve them.
            undo()
            raise EngramError(
                "this GPU maps registered host memory at other addresses (no unified addressing); keep the tables on the GPU (cpu_offload=false)"
            )
    if not is_registered(runtime, mapping.addr, mapping.length, chunk_bytes=chunk_bytes):
        undo()
        raise EngramError(
            f"cudaHostRegister reported success but the CUDA driver does not see the {mapping.length:,} bytes at {mapping.addr:#x} as page-locked host memory; the GPU cannot read them (check the driver, or set cpu_offload=false)"
        )
    _live[key] = runtime
    mapping.on_release(undo)
    return mapping.addr


def track(mapping: Mapping, runtime: CudaRuntime) -> None:
    """Count `mapping` as host memory the GPU reads without registering it (cuMem host memory, mapped for
    the GPU by its allocator), until it is released."""
    key = (mapping.addr, mapping.length)
    _live[key] = runtime
    mapping.on_release(functools.partial(_forget, key))


def _forget(key: tuple[int, int]) -> None:
    _live.pop(key, None)


def is_registered(runtime: CudaRuntime, addr: int, size: int, *, chunk_bytes: int = CHUNK_BYTES) -> bool:
    """Whether the CUDA driver reports [addr, addr + size) as page-locked host memory, asked of its pointer
    attributes at the first and last byte of every registration chunk (ranges inside a mapping this
    process registered through `runtime` are known without asking). Never Tensor.is_pinned(): torch
    answers False for registered memory until it has created its own CUDA context."""
    if any(
        start <= addr and addr + size <= start + length and known is runtime for (start, length), known in _live.items()
    ):
        return True
    probes = sorted(
        {
            p
            for start in range(addr, addr + size, chunk_bytes)
            for p in (start, min(start + chunk_bytes, addr + size) - 1)
        }
    )
    for probe in probes:
        code, kind = runtime.pointer_memory_type(probe)
        if code != 0:
            runtime.get_last_error()  # clear it: a failed query must not surface in a later CUDA call
            return False
        if kind != MEMORY_TYPE_HOST:
            return False
    return True
