"""node_sharing "numa": which NUMA node's copy an engine maps, on simulated topologies (a fake /sys)."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

import pytest
import torch

from engram.runtime.placement import numa

GPUS = {"0000:1b:00.0": "0", "0000:9c:00.0": "1", "0000:ab:00.0": "-1"}


def topology(root: Path, nodes: dict[int, str], gpus: dict[str, str] = GPUS) -> Path:
    """A /sys with `nodes` (node -> cpulist) and PCI devices (bus id -> numa_node)."""
    system = root / "devices/system/node"
    system.mkdir(parents=True)
    (system / "online").write_text(",".join(str(n) for n in sorted(nodes)) + "\n")
    for node, cpus in nodes.items():
        (system / f"node{node}").mkdir()
        (system / f"node{node}/cpulist").write_text(cpus + "\n")
    for bus, node_text in gpus.items():
        device = root / "bus/pci/devices" / bus
        device.mkdir(parents=True)
        (device / "numa_node").write_text(node_text + "\n")
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("0", {0}),
        ("", set()),
        ("x,2-1,3-,5", {5}),
        ("0-99999999", set(range(1024))),
    ],
)
def test_sysfs_lists_are_parsed_bounded(text: str, expected: set[int]) -> None:
    assert numa.parse_list(text, 1024) == expected


def test_two_sockets_give_each_gpu_the_copy_of_its_own_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = topology(tmp_path, {0: "0-7", 1: "8-15"})
    gpu = torch.device("cuda", 0)
    for bus, expected in (("0000:1b:00.0", 0), ("0000:9c:00.0", 1), ("0000:AB:00.0", None)):
        monkeypatch.setattr(numa, "gpu_bus_id", lambda _device, bus=bus: bus)
        assert numa.copy_node("numa", gpu, root) == expected  # -1: the firmware does not say, one copy
        assert numa.copy_node("node", gpu, root) is None  # one copy for the machine
    cpu = torch.device("cpu")
    assert numa.copy_node("numa", cpu, root, cpus={9, 10, 3}) == 1  # most of its CPUs are node 1's
    assert numa.copy_node("numa", cpu, root, cpus={3, 9}) == 0  # a tie: the lower node
    assert numa.copy_node("numa", cpu, root, cpus={99}) is None


def test_one_numa_node_means_one_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = topology(tmp_path, {0: "0-15"})
    monkeypatch.setattr(numa, "gpu_bus_id", lambda _device: "0000:9c:00.0")
    assert numa.copy_node("numa", torch.device("cuda", 0), root) is None
    assert numa.copy_node("numa", torch.device("cpu"), root, cpus={1}) is None
    assert numa.online_nodes(tmp_path / "nowhere") == [0]  # no sysfs: one node


GET_MEMPOLICY = {"x86_64": 239, "aarch64": 236}


def policy() -> tuple[int, int]:
    """This thread's memory policy (mode, node mask) from get_mempolicy(2)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mode, mask = ctypes.c_int(), (ctypes.c_ulong * 16)()
    assert libc.syscall(GET_MEMPOLICY[platform.machine()], ctypes.byref(mode), mask, 1025, None, 0) == 0
    return mode.value, mask[0]


@pytest.mark.skipif(platform.machine() not in GET_MEMPOLICY, reason="set_mempolicy is called on x86_64 and aarch64")
def test_the_copy_is_reserved_under_a_preference_for_its_node() -> None:
    assert policy() == (numa.MPOL_DEFAULT, 0)
    with numa.preferring(0):
        assert policy() == (numa.MPOL_PREFERRED, 1)
    assert policy() == (numa.MPOL_DEFAULT, 0)
    with numa.preferring(None):
        assert policy() == (numa.MPOL_DEFAULT, 0)
