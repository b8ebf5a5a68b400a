"""Host tables a GPU maps with 2 MiB pages: pinned cuMem on the GPU's host NUMA node (engram_host_numa_map
in kernels/engram_runtime.cu), one address the host and the GPU both read and write, as vLLM 0.34 keeps
DeepSeek V4.1's shared host tables. A GPU maps memory registered with cudaHostRegister with small pages
whatever the host's page size (vLLM's measure: 64 KiB for a registered /dev/shm mapping), so random row
lookups miss its TLB far more; cuMem host memory it maps with 2 MiB pages. Where that cannot be had (no
NUMA, a driver without host-NUMA allocations, a node short of memory), tables are registered as before, and
the process says so once, naming the page size. scripts/gpu_check.py's host-pages stage measures the three
side by side on a GPU. The runtime is injected, so the logic is tested without one."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Protocol, runtime_checkable

from engram.memory.mapping import Mapping, map_anonymous
from engram.memory.registration import CudaRuntime, register, track

log = logging.getLogger("engram")
CHUNK_BYTES = 2 << 30  # allocations are made in chunks: each fails on its own rather than wait on one huge one
NUMA_RESERVE = 0.05  # of the node's memory left to everything else, as vLLM leaves it
ATTRIBUTE_HOST_NUMA_ID = 134  # cudaDevAttrHostNumaId: the host NUMA node nearest the GPU (-1: none)
STEPS = {
    1: "finding the driver's cuMem calls",
    2: "cuDeviceGet",
    3: "the GPU's host NUMA node",
    4: "cuMemGetAllocationGranularity",
    5: "cuMemCreate",
    6: "cuMemAddressReserve",
    7: "cuMemMap",
    8: "cuMemSetAccess",
}
SYSFS = Path("/sys")


@runtime_checkable
class HostNumaRuntime(CudaRuntime, Protocol):
    """The CUDA runtime with the kernel library's host-NUMA calls; each returns a CUresult."""

    def host_numa_map(self, size: int, chunk: int, node: int) -> tuple[int, int, int, int, int]: ...
    def host_numa_unmap(self, addr: int, length: int, chunk: int) -> int: ...


def node_memory(node: int, root: Path | None = None) -> tuple[int, int] | None:
    """(total, free) bytes of NUMA node `node` (its meminfo under `root`, SYSFS by default), or None where
    sysfs does not say."""
    try:
        text = ((root or SYSFS) / f"devices/system/node/node{int(node)}/meminfo").read_text(errors="replace")[
            : 64 << 10
        ]
    except OSError:
        return None
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[2] in ("MemTotal:", "MemFree:") and parts[3].isdigit():
            found[parts[2]] = int(parts[3]) * 1024
    if "MemTotal:" not in found or "MemFree:" not in found:
        return None
    return found["MemTotal:"], found["MemFree:"]


def map_host_numa(size: int, runtime: HostNumaRuntime, root: Path | None = None) -> Mapping | str:
    """`size` bytes of host-NUMA cuMem on the GPU's nearest node, as a Mapping whose release unmaps it (the
    GPU reads it at its own address: unified addressing, as registered memory), or why not."""
    code, node = runtime.device_attribute(ATTRIBUTE_HOST_NUMA_ID)
    if code != 0:
        runtime.get_last_error()  # a failed query must not surface in a later CUDA call
        return f"the GPU's host NUMA node is unknown ({runtime.error_string(code)})"
    if node < 0:
        return "the machine reports no NUMA node for the GPU"
    memory = node_memory(node, root)
    if memory is not None and memory[1] - size < memory[0] * NUMA_RESERVE:
        return f"NUMA node {node} has {memory[1]:,} bytes free, and {size:,} would leave under {NUMA_RESERVE:.0%} of it"
    code, addr, padded, granule, step = runtime.host_numa_map(size, CHUNK_BYTES, node)
    if code != 0:
        runtime.get_last_error()
        return f"{STEPS.get(step, f'step {step}')} failed: {runtime.error_string(code)} (CUresult {code})"
    unmap = functools.partial(_unmap, runtime)
    mapping = Mapping(addr, size, padded, "pinned", gpu_page=granule, unmap=unmap)
    track(mapping, runtime)  # the GPU reads it: a lookup's check finds it without asking the driver
    return mapping


def _unmap(runtime: HostNumaRuntime, addr: int, length: int) -> None:
    if runtime.host_numa_unmap(addr, length, CHUNK_BYTES) != 0:
        runtime.get_last_error()


def pinned_for_gpu(size: int, runtime: CudaRuntime) -> Mapping:
    """Host memory for a table the GPU reads: host-NUMA cuMem where it can be had (2 MiB GPU pages), else
    an exact anonymous mapping registered for UVA, with one warning a process naming the page size."""
    why = map_host_numa(size, runtime) if isinstance(runtime, HostNumaRuntime) else "this runtime has no cuMem calls"
    if isinstance(why, Mapping):
        return why
    mapping = map_anonymous(size, kind="pinned")
    register(mapping, runtime)
    small_pages(why)
    return mapping


@functools.cache
def small_pages(why: str) -> None:
    """Say once per reason that host tables are registered memory, with the GPU page size that costs."""
    log.warning(
        "engram: host tables are registered host memory, which a GPU maps with small pages (64 KiB, not the "
        "2 MiB of host-NUMA cuMem), so random row lookups miss its TLB more: %s",
        why,
    )
