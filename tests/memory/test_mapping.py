"""Mappings that hold tables: pinned private mappings are not copied into a forked child, and a file on
hugetlbfs is mapped and unmapped in whole huge pages (a page-rounded munmap fails there and leaks)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engram.memory import mapping as mapping_module
from engram.memory.mapping import HUGE_PAGE, HUGETLBFS_MAGIC, PAGE, map_anonymous, map_readonly_file


def vm_flags(addr: int) -> list[str]:
    """The VmFlags of the smaps entry holding `addr`."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.parametrize("kind, dont_fork", [("pinned", True), ("hugepages", True), ("host", False)])
def test_only_mappings_a_gpu_may_register_are_kept_from_forked_children(kind: str, dont_fork: bool) -> None:
    mapping = map_anonymous(4 * PAGE, kind=kind)
    try:
        flags = vm_flags(mapping.addr)
        assert ("dc" in flags) is dont_fork and "dd" in flags  # dc: not copied on fork; dd: not dumped
    finally:
        mapping.release()


def test_a_file_on_hugetlbfs_is_mapped_in_whole_huge_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "table"
    path.write_bytes(b"x" * 5000)
    monkeypatch.setattr(mapping_module, "file_system", lambda fd: (HUGETLBFS_MAGIC, HUGE_PAGE))
    fd = os.open(path, os.O_RDONLY)
    try:
        mapping = map_readonly_file(fd, 5000, str(path))
    finally:
        os.close(fd)
    assert mapping.length == HUGE_PAGE and mapping.size == 5000
    assert mapping.release() is True  # unmapped with the length it was mapped with


def test_files_elsewhere_are_mapped_in_pages(tmp_path: Path) -> None:
    path = tmp_path / "table"
    path.write_bytes(b"x" * 5000)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert mapping_module.file_granule(fd) == PAGE
        mapping = map_readonly_file(fd, 5000, str(path))
    finally:
        os.close(fd)
    assert mapping.length == 2 * PAGE
    mapping.release()
