"""A bounded estimate of how often each row id was looked up lately: a count-min sketch (DEPTH rows of
`width` int32 counters, one hash per row, the estimate the least of an id's DEPTH counters, never below
the true count, updated conservatively) whose counters are halved every `half_life` additions, so that the estimate follows the
traffic: what a domain switch made cold fades out within a few half-lives. Its memory is
DEPTH x width x 4 bytes, whatever the table's size or the stream's length. Torch ops on the sketch's
device, static shapes: on a GPU nothing here waits on the host."""

from __future__ import annotations

import torch

DEPTH = 4
# Odd multipliers below 2**23: an id below 2**40 times one stays inside int64 (no overflow to wrap).
_MULTIPLIERS = (0x5BD1E9, 0x6C8E95, 0x4F1BB3, 0x7A3D2F)
_OFFSETS = (0x2545F4, 0x1B8735, 0x3C6EF3, 0x0A54FF)
ID_BITS = 40  # row ids are hashed from their low 40 bits (tables are far smaller than 2**40 rows)
MAX_WIDTH = 1 << 24
SATURATED = (1 << 31) - 1  # a counter's ceiling: the int32 maximum


def sketch_width(distinct: int) -> int:
    """Counters per row for a stream of about `distinct` distinct ids between half-lives: a power of
    two at least twice that (few collisions), between 4,096 and MAX_WIDTH."""
    width = 1 << 12
    while width < 2 * distinct and width < MAX_WIDTH:
        width <<= 1
    return width


class FrequencySketch:
    """Count-min sketch with periodic halving (module docstring)."""

    def __init__(self, width: int, device: torch.device | str = "cpu", *, half_life: int | None = None) -> None:
        """`width`: counters per row, a power of two; `half_life`: additions (add() calls) between
        halvings (None: never)."""
        if width <= 0 or width & (width - 1) or width > MAX_WIDTH:
            raise ValueError(f"a sketch's width is a power of two up to {MAX_WIDTH:,}, got {width:,}")
        self.width = width
        self.half_life = half_life
        self.counts = torch.zeros(DEPTH, width, dtype=torch.int32, device=device)
        self._row_base = torch.arange(DEPTH, device=device, dtype=torch.int64).view(DEPTH, 1) * width
        self._mult = torch.tensor(_MULTIPLIERS, device=device, dtype=torch.int64).view(DEPTH, 1)
        self._off = torch.tensor(_OFFSETS, device=device, dtype=torch.int64).view(DEPTH, 1)
        self.additions = 0

    @property
    def nbytes(self) -> int:
        return self.counts.numel() * self.counts.element_size()

    def _cells(self, ids: torch.Tensor) -> torch.Tensor:
        """int64 [DEPTH, n]: each id's counter in each row, as flat indices into counts."""
        x = (ids.reshape(1, -1).to(torch.int64) & ((1 << ID_BITS) - 1)) * self._mult + self._off
        x = x ^ (x >> 23)
        return (x & (self.width - 1)) + self._row_base

    def add(self, ids: torch.Tensor, counts: torch.Tensor | None = None) -> bool:
        """Count one look-up of each of `ids` (repeats count each time), or `counts` of each; halve every
        counter each half_life additions, first, and say whether this one did. A conservative update:
        each distinct id raises its counters only as far as its new estimate (its least counter plus its
        count), so collisions inflate the estimates of rare ids far less than adding to every counter
        would. Counters saturate at SATURATED, never overflow."""
        self.additions += 1
        halved = bool(self.half_life and self.additions % self.half_life == 0)
        if halved:
            self.halve()
        if not ids.numel():
            return halved
        flat = ids.reshape(-1).to(torch.int64)
        if counts is None:
            distinct, step = torch.unique(flat, return_counts=True)
        else:
            distinct, where = torch.unique(flat, return_inverse=True)
            weights = counts.reshape(-1).to(device=flat.device, dtype=torch.int64).clamp(0, SATURATED)
            step = torch.zeros(distinct.numel(), dtype=torch.int64, device=flat.device).index_add_(0, where, weights)
        target = (self.estimate(distinct).to(torch.int64) + step).clamp_(max=SATURATED).to(torch.int32)
        cells = self._cells(distinct)
        self.counts.view(-1).scatter_reduce_(0, cells.reshape(-1), target.expand(DEPTH, -1).reshape(-1), "amax")
        return halved

    def halve(self) -> None:
        """Halve every counter: what was counted so far weighs half as much as what comes next."""
        self.counts.bitwise_right_shift_(1)

    def estimate(self, ids: torch.Tensor) -> torch.Tensor:
        """int32 [n]: the estimated recent count of each id (at least its true count since the last halving)."""
        if not ids.numel():
            return torch.zeros(0, dtype=torch.int32, device=self.counts.device)
        return self.counts.view(-1)[self._cells(ids)].amin(dim=0)
