"""Row ids as the gather kernels take them: flat int64, and in the sorted form (ascending, with the order
that sorted them and the first index of each run of equals) where reading each distinct row once, in
address order, pays."""

from __future__ import annotations

import torch

from engram.ops.segments import Rows

# When the sorted form pays, in lookups per call (None: never). The GPU's translation of scattered host
# addresses, not PCIe, limits random reads of host tables: on the H200 (issue 11) 1M uniform V4.1 lookups
# ran at 7.1 GB/s plain and 41 GB/s sorted from an 8 GiB pinned table (4.9 and 22 from 32 GiB), and even
# a 1 GiB table gained 2x. The floor below which the sort's extra launches cost more than they save is
# provisional until scripts/gpu_check.py's decode and prefill rows are measured: set from its table.
# Device tables read at 0.87x a D2D copy already, and on the CPU the sort did not pay (bench_lookup.py,
# 2 cores, 4 GiB fp8 table: 0.87-1.08x the plain gather, uniform and real-text ids).
SORT_MIN_LOOKUPS = {"uva": 4096, "device": None, "cpu": None}


def use_sorted(lookups: int, weight: Rows, device: torch.device) -> bool:
    """Whether a gather of `lookups` rows of `weight` on `device` should take the sorted form."""
    where = "cpu" if device.type == "cpu" else "uva" if weight.device.type == "cpu" else "device"
    floor = SORT_MIN_LOOKUPS[where]
    return floor is not None and lookups >= floor


def sort_ids(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sorted form of a gather's ids ([n] int64), in static shapes (capturable, no host sync): ids
    ascending, the order that sorted them, and for each position the first index of its run of equals."""
    ordered, order = torch.sort(ids)
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    index = torch.arange(ids.numel(), device=ids.device)
    leader = torch.where(first, index, 0).cummax(0).values
    return ordered, order, leader


def kernel_ids(ids: torch.Tensor, sorted: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The ids as every kernel takes them: flat contiguous int64, and with `sorted` in the sorted form
    (with order and leader)."""
    flat = ids.reshape(-1).to(torch.int64).contiguous()
    if sorted and flat.numel():
        return sort_ids(flat)
    return flat, None, None
