"""Rules of the placement layer written plainly, as oracles for the kernels that implement them."""

from __future__ import annotations

ALIGN = 4096  # direct_cpu.c's alignment of a direct read


def direct_ranges(size: int, offset: int, row_bytes: int, rows: list[int], gap: int, most: int) -> tuple[int, int]:
    """(reads, bytes read) of engram_read_direct_cpu for these shard-local rows (ascending) of a part at
    file `offset` in a file of `size` bytes, as its header states the rule: each row's aligned page span
    joins the range before it when it starts at most `gap` bytes past that range's end and the range then
    spans at most `most` (or one row's widest span, for rows longer than that); the read of the file's last
    range stops at its end."""
    one_row = -(-(row_bytes + ALIGN - 1) // ALIGN) * ALIGN
    span = max(most, one_row)
    spans: list[list[int]] = []
    for row in rows:
        start = offset + row * row_bytes
        first, end = start // ALIGN * ALIGN, -(-(start + row_bytes) // ALIGN) * ALIGN
        if spans and first <= spans[-1][1] + gap and end - spans[-1][0] <= span:
            spans[-1][1] = end
        else:
            spans.append([first, end])
    return len(spans), sum(min(end, size) - first for first, end in spans)
