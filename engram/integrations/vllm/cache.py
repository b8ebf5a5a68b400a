"""The tiers of hot rows inside vLLM: device_cache_bytes keeps each host table's hottest rows on the GPU,
ram_cache_bytes each file-backed table's in RAM, both through the table layer (Table.keep_hot), chosen
as cache_admission says (by default from the traffic, device_cache_profile its warm start). Hits read
the tier, misses the table below it, bit for bit the uncached lookup. The rank's budget is split evenly
over the profile's tables (the model's, without one), as engram's engine splits it over the rank's. A table's tier is built on its
first lookup, when vLLM has loaded its weights (vLLM's profile run comes before any CUDA graph capture),
and refreshes itself between steps (Table.lookup). On vLLM's CPU platform the device tier lives in host
memory: the same lookups, for the tests."""

from __future__ import annotations

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm.files import layer_tail
from engram.runtime.table import Profile, Table, read_profile

_PROFILES: dict[str, Profile] = {}  # one read per profile file and process


def profile(config: EngramConfig) -> Profile | None:
    """The hot rows per table of the configured profile (read once; None without one); checked when the
    settings are."""
    path = config.device_cache_profile
    if path is None:
        if config.cache_admission == "static":
            raise EngramError(
                "engram setting 'cache_admission' 'static' needs 'device_cache_profile': the hot rows `engram profile --out` wrote for this model (or use 'online')"
            )
        return None
    if path not in _PROFILES:
        _PROFILES[path] = read_profile(path)
    return _PROFILES[path]


def keep_hot(config: EngramConfig | None, name: str, table: Table, tables: int) -> None:
    """Give `table` (the rows this rank holds of the table vLLM names `name`, one of the model's `tables`)
    its tier, when one is configured."""
    if config is None:
        return
    in_ram = bool(table.shard.files) and config.ram_cache_bytes > 0
    budget = config.ram_cache_bytes if in_ram else config.device_cache_bytes
    if not budget:
        return
    hot = profile(config)
    own = counts = None
    if hot is not None:
        tail = layer_tail(name)
        found = [t for t in hot if t == name or t.endswith(tail)]
        if len(found) != 1:
            raise EngramError(
                f"engram device_cache_profile {config.device_cache_profile}: it should hold the hot rows of one table ending in {tail}, it holds {len(found)}; profile this model with `engram profile --out`"
            )
        own, counts = hot[found[0]], hot.counts.get(found[0])
    device = "cpu" if in_ram or not torch.cuda.is_available() else "cuda"
    share = len(hot) if hot is not None else max(1, tables)
    table.keep_hot(
        budget // share,
        device,
        "ram" if in_ram else "device",
        policy=config.cache_admission,
        hot=own,
        hot_counts=counts,
    )
