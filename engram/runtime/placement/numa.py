"""Which NUMA node a node-shared table copy belongs to (node_sharing "numa"), read from sysfs, and how its
pages are put there.

A copy per NUMA node that holds GPUs, each GPU's engines attaching to the copy on the node nearest it
(its PCI device's numa_node). With one NUMA node, or a GPU whose node the firmware does not report (-1),
there is one copy for the machine. Without a GPU, a process belongs to the node that holds most of the
CPUs it may run on. `root` stands for /sys, so tests can describe any topology."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import platform
from collections.abc import Iterator
from pathlib import Path

import torch

SYSFS = Path("/sys")
MAX_NODES = 1024  # the kernel's limit (CONFIG_NODES_SHIFT 10)
TEXT_LIMIT = 64 << 10  # a cpulist or node list is a line; anything longer is not sysfs
MPOL_DEFAULT, MPOL_PREFERRED = 0, 1
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}  # syscall numbers; other machines place pages by first touch


def parse_list(text: str, limit: int) -> set[int]:
    """A sysfs list ("0-3,8,10-11") as a set, ignoring anything malformed or at or above `limit`."""
    found: set[int] = set()
    for part in text.strip().split(","):
        low, dash, high = part.partition("-")
        if not (low.isascii() and low.isdigit() and ((high.isascii() and high.isdigit()) or not dash)):
            continue
        first, last = int(low), int(high or low)
        found.update(range(first, min(last, limit - 1) + 1))
    return found


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(TEXT_LIMIT)
    except OSError:
        return None


def online_nodes(root: Path = SYSFS) -> list[int]:
    """The machine's NUMA nodes ([0] where sysfs does not say)."""
    text = _read(root / "devices/system/node/online")
    return sorted(parse_list(text, MAX_NODES)) or [0] if text else [0]


def node_cpus(node: int, root: Path = SYSFS) -> set[int]:
    text = _read(root / f"devices/system/node/node{node}/cpulist")
    return parse_list(text, 1 << 20) if text else set()


def pci_node(bus_id: str, root: Path = SYSFS) -> int | None:
    """The NUMA node of PCI device `bus_id` (dddd:bb:dd.f), or None when the firmware does not say."""
    text = _read(root / "bus/pci/devices" / bus_id.lower() / "numa_node")
    value = text.strip() if text else ""
    return int(value) if value.isdigit() and int(value) < MAX_NODES else None


GPU_CLASSES = ("0x0300", "0x0302")  # VGA and 3D controllers
MAX_PCI_DEVICES = 4096


def gpu_nodes(root: Path = SYSFS) -> list[int | None]:
    """The NUMA node of each GPU on the PCI bus (None where the firmware does not say), in bus order."""
    found: list[int | None] = []
    try:
        devices = sorted(os.listdir(root / "bus/pci/devices"))[:MAX_PCI_DEVICES]
    except OSError:
        return found
    for bus in devices:
        kind = (_read(root / "bus/pci/devices" / bus / "class") or "").strip()
        if kind.startswith(GPU_CLASSES):
            found.append(pci_node(bus, root))
    return found


def gpu_bus_id(device: torch.device) -> str | None:
    """The PCI address of a CUDA device, as sysfs names it."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(p is None for p in parts):
        return None
    domain, bus, slot = (int(p) for p in parts)  # type: ignore[arg-type]
    return f"{domain:04x}:{bus:02x}:{slot:02x}.0"


def copy_node(mode: str, device: torch.device, root: Path = SYSFS, *, cpus: set[int] | None = None) -> int | None:
    """The NUMA node whose copy this process maps: None for one copy per machine (mode "node", one NUMA
    node, or a GPU whose node is not known). `cpus`: the CPUs this process may run on (default: its
    affinity), which decide without a GPU."""
    nodes = online_nodes(root)
    if mode != "numa" or len(nodes) < 2:
        return None
    if device.type == "cuda":
        bus = gpu_bus_id(device)
        return pci_node(bus, root) if bus else None
    allowed = os.sched_getaffinity(0) if cpus is None else cpus
    shares = {node: len(node_cpus(node, root) & allowed) for node in nodes}
    best = max(shares, key=lambda n: (shares[n], -n))
    return best if shares[best] else None


_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@contextlib.contextmanager
def preferring(node: int | None) -> Iterator[None]:
    """Memory this thread allocates inside goes to `node` while it has room (MPOL_PREFERRED; it falls back
    to other nodes rather than fail). None, or a machine without the syscall: the default policy."""
    number = SET_MEMPOLICY.get(platform.machine())
    if node is None or number is None or not 0 <= node < MAX_NODES:
        yield
        return
    mask = (ctypes.c_ulong * (MAX_NODES // 64))()
    mask[node // 64] = 1 << (node % 64)
    placed = _libc.syscall(number, MPOL_PREFERRED, mask, MAX_NODES + 1) == 0  # the kernel counts maxnode - 1 bits
    try:
        yield
    finally:
        if placed:
            _libc.syscall(number, MPOL_DEFAULT, None, 0)
