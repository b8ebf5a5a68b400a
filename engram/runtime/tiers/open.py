"""A tier of one shard's hottest rows, opened for a budget: its kind and class decided here, once, by what
a miss costs (the package's docstring: a RAM tier over a file on disk, a device tier over memory), its
capacity by what the budget holds once the tier's own state is paid."""

from __future__ import annotations

import contextlib
import logging

import torch

from engram.errors import EngramError
from engram.runtime.placement.file_reads import private_scales
from engram.runtime.placement.filemap import in_files
from engram.runtime.placement.residency import DiskReads
from engram.runtime.shard import TableShard
from engram.runtime.tiers.budget import POLICIES, WINDOW_IDS, Policy, TierName, capacity_for, tier_bytes
from engram.runtime.tiers.device import DeviceTier
from engram.runtime.tiers.ram import RamTier

Tier = DeviceTier | RamTier
SCALES_SHARE = 4  # a RAM tier keeps its file's block scales in private memory when they take at most 1/4 of it
log = logging.getLogger("engram")


def kind_of(shard: TableShard) -> TierName:
    """The tier a shard's misses call for: a RAM tier over a file on disk, where a miss is a disk read; a
    device tier over memory (a file on tmpfs or hugetlbfs among it), where a miss is a memory read."""
    return "ram" if shard.readahead else "device"


def refusal(shard: TableShard, name: TierName, device: torch.device | str) -> str | None:
    """Why `shard` takes no `name` tier on `device` (the config field named, and what to set instead), or
    None where it does. A tier of the other kind than kind_of's is refused, on every device."""
    if name == "ram" and kind_of(shard) != "ram":
        where = "its file is on tmpfs or hugetlbfs, in memory" if shard.files else "it is in memory"
        return (
            f"ram_cache_bytes is not used for {shard.name}: {where} already (device_cache_bytes keeps its hottest rows)"
        )
    if name == "device" and kind_of(shard) != "device":
        return (
            f"device_cache_bytes is not used for {shard.name}: its file is on disk, where a miss is a disk read "
            "and its hot rows are kept by a RAM tier: give it ram_cache_bytes (or put the checkpoint on tmpfs)"
        )
    if name == "device" and shard.staged and torch.device(device).type == "cuda":
        return (
            f"device_cache_bytes is not used for {shard.name}: its file is gathered on host threads (put the "
            "checkpoint on tmpfs to read it over UVA and cache it, or give it ram_cache_bytes)"
        )
    return None


def open_tier(
    shard: TableShard,
    budget_bytes: int,
    device: torch.device | str,
    name: TierName | None = None,
    *,
    policy: str = "online",
    hot: torch.Tensor | None = None,
    hot_counts: torch.Tensor | None = None,
    disk_reads: DiskReads | None = None,
    **tuning: int,
) -> Tier | None:
    """A tier of this shard's hottest rows in `device` memory, as many as `budget_bytes` hold with the
    tier's own state (capacity_for) and, for a RAM tier, the block scales it may keep (scales_kept); None
    where it holds no row (said with the budget that would hold one) or the shard takes no `name` tier
    there (refusal, said). `name` (default: kind_of's) is its kind and class: a RamTier in host memory,
    a DeviceTier in `device` memory. `hot`: a profile's rows (most frequent first), its warm start, and
    `hot_counts` their counts; with policy "static" the only rows it holds (None where the profile has
    none of this shard's). `tuning`: the device tier's window_ids and half_life; `disk_reads` counts what
    its warm start reads."""
    kind = kind_of(shard) if name is None else name
    why = refusal(shard, kind, device)
    if why is not None:
        log.warning("engram: %s", why)
        return None
    if policy not in POLICIES:
        raise EngramError(f"{shard.name}: a tier's policy is one of {', '.join(POLICIES)}, not {policy!r}")
    if policy == "static" and hot is None:
        raise EngramError(f"{shard.name}: a static tier keeps a profile's rows; give it one (engram profile --out)")
    checked: Policy = "online" if policy == "online" else "static"
    window = tuning.get("window_ids", WINDOW_IDS)
    scales = scales_kept(shard, budget_bytes)
    row_bytes, eager = shard.format.row_bytes, shard.readahead
    capacity = capacity_for(budget_bytes - scales, row_bytes, shard.rows, window, checked, eager=eager)
    if capacity == 0:
        if budget_bytes > 0 and shard.rows:
            need = scales + tier_bytes(1, row_bytes, shard.rows, window, checked, eager)
            log.warning(
                "engram: %s gets no %s tier of hot rows: its %s bytes hold no row once the tier's own state is "
                "paid; give its tier at least %s bytes (the rank's budget is split over its tables), or 0 for none",
                shard.name, kind, f"{budget_bytes:,}", f"{need:,}",
            )  # fmt: skip
        return None
    counted = disk_reads or contextlib.nullcontext
    if scales:
        with counted():
            private_scales(shard)
    tier: Tier
    if kind == "ram":
        tier = RamTier(shard, capacity, policy=checked, scale_bytes=scales, disk_reads=disk_reads)
    else:
        tier = DeviceTier(shard, capacity, device, policy=checked, scale_bytes=scales, **tuning)
    if hot is not None:
        with counted():
            held = tier.warm(hot, hot_counts)
        if held == 0 and policy == "static":
            return None  # the profile has none of this shard's rows
    return tier


def scales_kept(shard: TableShard, budget_bytes: int) -> int:
    """The bytes of a RAM tier's budget its shard's block scales take in private memory (private_scales):
    kept there when they take at most 1/SCALES_SHARE of it, so that most of it holds rows, or when they
    already are."""
    scale = shard.scale
    if not shard.readahead or scale is None:
        return 0
    size = scale.numel() * scale.element_size()
    return 0 if in_files(shard, scale) and size * SCALES_SHARE > budget_bytes else size
