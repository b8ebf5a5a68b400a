"""Rows read once per distinct id, written to every position that asked for them."""

from __future__ import annotations

import torch

from engram.memory.outputs import empty_cpu


class Spread:
    """Rows gathered once per distinct id, written to every position of a lookup's ids that asked for
    them: `inverse` (torch.unique's) maps each position to its distinct id. Into `out` when given, else a
    new (recycled) output made on the first put, of the rows' width and dtype."""

    def __init__(self, inverse: torch.Tensor, distinct: int, out: torch.Tensor | None) -> None:
        self.order = torch.argsort(inverse, stable=True)  # positions, grouped by distinct id
        self.counts = torch.bincount(inverse, minlength=distinct)
        self.starts = self.counts.cumsum(0) - self.counts
        self.rows = None if out is None else out.view(inverse.numel(), -1)

    def put(self, at: torch.Tensor, got: torch.Tensor) -> None:
        """`got[i]` is the row of distinct id `at[i]`."""
        if self.rows is None:
            self.rows = empty_cpu((self.order.numel(), *got.shape[1:]), got.dtype)
        counts = self.counts[at]
        local = torch.repeat_interleave(torch.arange(at.numel()), counts)
        offsets = torch.arange(local.numel()) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        self.rows[self.order[self.starts[at][local] + offsets]] = got[local]

    def result(self, shape: torch.Size, out: torch.Tensor | None) -> torch.Tensor:
        assert self.rows is not None
        return out if out is not None else self.rows.view(*shape, *self.rows.shape[1:])
