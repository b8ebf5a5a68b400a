"""Memory of mappings, read per mapping from /proc/PID/smaps: what a table costs, apart from the
interpreter's own memory."""

from __future__ import annotations

from pathlib import Path


def smaps_totals(addr: int, length: int, fields: tuple[str, ...], pid: int | str = "self") -> dict[str, int]:
    """Sums, in bytes, of `fields` (Rss, Pss, AnonHugePages, ...) over [addr, addr + length). The kernel
    may merge a mapping with a like neighbour into one smaps entry; such an entry counts in proportion
    to its overlap with the range."""
    totals = dict.fromkeys(fields, 0.0)
    share = 0.0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(None, 1)[0]
        if not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            overlap = min(hi, addr + length) - max(lo, addr)
            share = overlap / (hi - lo) if overlap > 0 else 0.0
        elif share and head[:-1] in totals:
            totals[head[:-1]] += int(line.split()[1]) * 1024 * share
    return {k: round(v) for k, v in totals.items()}


def pss(addr: int, length: int, pid: int | str = "self") -> int:
    """Proportional set size of a mapping: shared pages count 1/n in each of the n processes mapping them."""
    return smaps_totals(addr, length, ("Pss",), pid)["Pss"]
