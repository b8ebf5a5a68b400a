"""What an admission decides, whichever tier makes it: the rows it admits and their slots (Change), and
the rows of a profile a shard owns."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engram.errors import EngramError


@dataclass
class Change:
    """What one refresh did: the rows admitted and the slots they go to; how many rows it evicted."""

    admitted: torch.Tensor
    slots: torch.Tensor
    evicted: int


def owned_rows(
    hot: torch.Tensor, counts: torch.Tensor | None, rows: tuple[int, int], capacity: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A profile's first `capacity` rows in [rows) (global ids, most frequent first) and their counts."""
    if hot.dtype != torch.int64 or hot.dim() != 1:
        raise EngramError(f"a profile's hot rows are a 1-D int64 tensor; got {hot.dtype} {list(hot.shape)}")
    if counts is not None and counts.shape != hot.shape:
        raise EngramError(f"a profile's counts are one per hot row: {list(counts.shape)} for {hot.numel()} rows")
    mine = (hot >= rows[0]) & (hot < rows[1])
    owned = hot[mine][:capacity]
    if torch.unique(owned).numel() != owned.numel():
        raise EngramError("the profile lists a row twice; write it again with `engram profile --out`")
    return owned, None if counts is None else counts.to(hot.device)[mine][:capacity]
