"""Which tier a table gets and with what budget, written once for engram's engine and the vLLM plugin:
ram_cache_bytes gives a RamTier to each table of a checkpoint file on disk, device_cache_bytes a
DeviceTier to each table in memory (a file on tmpfs or hugetlbfs among them) that its device can read,
each budget split evenly over the rank's tables that take it; a profile is their warm start, or with
cache_admission "static" all they hold. The refusals are worded here, once."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.runtime.shard import TableShard
from engram.runtime.tiers.budget import TierName
from engram.runtime.tiers.open import kind_of, refusal
from engram.runtime.tiers.profile import Profile, read_profile


class Tiered(Protocol):
    """What keep_hot gives a tier to (engram.runtime.table.Table, whose keep_hot opens it)."""

    shard: TableShard

    @property
    def name(self) -> str: ...

    def keep_hot(self, budget_bytes: int, device: torch.device | str, name: TierName, **profile: Any) -> int: ...


log = logging.getLogger("engram")
STATIC_NEEDS_PROFILE = (
    "cache_admission 'static' keeps the rows of a profile: set device_cache_profile to the hot rows "
    "`engram profile --out` wrote for this model, or use cache_admission 'online'"
)


def configured_profile(
    config: EngramConfig, given: str | os.PathLike[str] | Mapping[str, torch.Tensor] | None = None
) -> Mapping[str, torch.Tensor] | None:
    """The hot rows per table the tiers start from: `given`, else device_cache_profile's (read now, before
    anything is loaded); None without one or without a tier to start."""
    if not (config.device_cache_bytes or config.ram_cache_bytes):
        return None
    profile = given if given is not None else config.device_cache_profile
    if profile is None:
        if config.cache_admission == "static":
            raise EngramError(STATIC_NEEDS_PROFILE)
        return None
    return profile if isinstance(profile, Mapping) else read_profile(profile)


def tier_of(config: EngramConfig, shard: TableShard) -> TierName | None:
    """The tier the config gives this shard (module docstring), if any: its kind's (open.kind_of), where
    the config gives that a budget; a file on disk given device_cache_bytes alone is refused when its tier
    opens, and a file in memory given ram_cache_bytes is said to be here (open.refusal words both)."""
    if kind_of(shard) == "ram":
        return "ram" if config.ram_cache_bytes else "device" if config.device_cache_bytes else None
    if shard.files and config.ram_cache_bytes:
        log.warning("engram: %s", refusal(shard, "ram", "cpu"))
    return "device" if config.device_cache_bytes else None


def keep_hot(
    config: EngramConfig,
    tables: Sequence[Tiered],
    device: torch.device | str,
    profile: Mapping[str, torch.Tensor] | None = None,
    *,
    among: int | None = None,
    profile_key: Callable[[str], str] | None = None,
) -> None:
    """Give each of `tables` its tier (module docstring) on `device` (a RAM tier's always in host memory),
    warm from `profile` (configured_profile). Each budget is split over the tables that take it: these, or
    `among` where the caller gives the rank's tables one at a time (vLLM builds its layers one by one).
    `profile_key`: the profile's name for a table's (default: the same)."""
    named = {t.name: (profile_key or str)(t.name) for t in tables}
    missing = sorted(n for n, key in named.items() if profile is not None and key not in profile)
    if missing:
        raise EngramError(
            f"the profile has no hot rows for {', '.join(missing)}; profile this model with `engram profile --out`"
        )
    chosen = [(t, tier_of(config, t.shard)) for t in tables]
    for table, name in chosen:
        if name is None:
            continue
        budget = config.ram_cache_bytes if name == "ram" else config.device_cache_bytes
        share = among if among is not None else sum(1 for _, n in chosen if n == name)
        key = named[table.name]
        table.keep_hot(
            budget // max(1, share),
            "cpu" if name == "ram" else device,
            name,
            policy=config.cache_admission,
            hot=None if profile is None else profile[key],
            hot_counts=None if not isinstance(profile, Profile) else profile.counts.get(key),
        )
