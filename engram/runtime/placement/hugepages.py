"""Private host tables on transparent huge pages: far fewer TLB misses for random row lookups.

PMD-aligned anonymous mapping, MADV_HUGEPAGE, a chunked prefault that backs off while the node is under
memory pressure, coverage read from /proc/self/smaps, MADV_COLLAPSE where coverage is low. Every step
is best effort: any failure leaves ordinary pages and a logged warning, never a wrong result."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engram.memory.mapping import MADV_HUGEPAGE, MADV_POPULATE_WRITE, PAGE, Mapping, madvise, map_anonymous
from engram.memory.smaps import smaps_totals

log = logging.getLogger("engram.hugepages")

MADV_COLLAPSE = 25
THP = Path("/sys/kernel/mm/transparent_hugepage")
PREFAULT_CHUNK = 256 << 20
PRESSURE_LIMIT = 20.0  # percent of time some task stalled on memory (avg10) before we pause
PRESSURE_WAIT_S = 30.0
COLLAPSE_BELOW = 0.9


@dataclass(frozen=True)
class HugePageReport:
    mapping: Mapping
    thp_mode: str
    huge_bytes: int
    coverage: float  # AnonHugePages / mapped length
    note: str  # what happened, in words (also logged when it fell back)


def pmd_size(thp: Path = THP) -> int:
    try:
        return int((thp / "hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20


def thp_mode(thp: Path = THP) -> str:
    """always, madvise or never (the bracketed word of .../enabled), or 'unavailable'."""
    try:
        text = (thp / "enabled").read_text()
    except OSError:
        return "unavailable"
    return text[text.index("[") + 1 : text.index("]")] if "[" in text else "unavailable"


def huge_bytes_in(addr: int, length: int) -> int:
    return smaps_totals(addr, length, ("AnonHugePages",))["AnonHugePages"]


def memory_pressure(path: Path = Path("/proc/pressure/memory")) -> float:
    try:
        first = path.read_text().splitlines()[0]
    except (OSError, IndexError):
        return 0.0
    fields = dict(part.split("=") for part in first.split()[1:])
    return float(fields.get("avg10", 0.0))


def prefault(mapping: Mapping, chunk: int = PREFAULT_CHUNK) -> None:
    """Touch every page now, in chunks, pausing while memory pressure is high (bounded wait)."""
    for offset in range(0, mapping.length, chunk):
        deadline = time.monotonic() + PRESSURE_WAIT_S
        while memory_pressure() > PRESSURE_LIMIT and time.monotonic() < deadline:
            time.sleep(0.1)
        size = min(chunk, mapping.length - offset)
        if madvise(mapping.addr + offset, size, MADV_POPULATE_WRITE) in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
            # kernels before 5.14: write one byte per page instead
            mapping.view(offset, (size,), torch.uint8)[::PAGE].zero_()


def map_huge(size: int, *, thp: Path = THP) -> HugePageReport:
    mode = thp_mode(thp)
    align = pmd_size(thp)
    mapping = map_anonymous(size, align=align, kind="hugepages")
    if mode in ("never", "unavailable"):
        note = f"transparent huge pages are {mode} on this kernel; the table uses ordinary pages"
        log.warning("engram: %s (enable THP: echo madvise > %s/enabled)", note, thp)
        prefault(mapping)
        return HugePageReport(mapping, mode, 0, 0.0, note)
    advice = madvise(mapping.addr, mapping.length, MADV_HUGEPAGE)
    prefault(mapping)
    huge = huge_bytes_in(mapping.addr, mapping.length)
    collapsed = ""
    if huge < COLLAPSE_BELOW * mapping.length:
        code = madvise(mapping.addr, mapping.length, MADV_COLLAPSE)
        collapsed = "; MADV_COLLAPSE " + ("ran" if code == 0 else f"failed ({errno.errorcode.get(code, code)})")
        huge = huge_bytes_in(mapping.addr, mapping.length)
    coverage = huge / mapping.length
    note = f"THP {mode}: {coverage:.0%} of {mapping.length:,} bytes on huge pages" + collapsed
    if advice:
        note += f"; MADV_HUGEPAGE failed ({errno.errorcode.get(advice, advice)})"
    if coverage < COLLAPSE_BELOW:
        log.warning("engram: %s; lookups work, with more TLB misses", note)
    return HugePageReport(mapping, mode, huge, coverage, note)
