"""The tiers of hot rows inside vLLM, given as engram's engine gives them (tiers.assign.keep_hot, through
the table layer's face): a table is given its tier on its first lookup, when vLLM has loaded its weights
(vLLM's profile run comes before any CUDA graph capture), with the rank's budget split over the model's
tables (the profile's, where one is given, else vLLM's count of them), and it refreshes itself between steps. On vLLM's CPU platform the device tier lives in host
memory: the same lookups, for the tests."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm.files import layer_tail
from engram.runtime.table import Table, configured_profile, keep_hot

_PROFILES: dict[str, Mapping[str, torch.Tensor] | None] = {}  # one read per profile file and process


def profile(config: EngramConfig) -> Mapping[str, torch.Tensor] | None:
    """The hot rows per table of the configured profile (read once; None without one); checked when the
    settings are."""
    key = config.device_cache_profile or ""
    if key not in _PROFILES or not key:
        _PROFILES[key] = configured_profile(config)
    return _PROFILES[key]


def give_tier(config: EngramConfig | None, name: str, table: Table, tables: int) -> None:
    """Give `table` (the rows this rank holds of the table vLLM names `name`, one of the model's `tables`)
    its tier, when one is configured. The profile names the table as the checkpoint does, which vLLM may
    prefix differently: its one table ending as `name` does from `layers.` on."""
    if config is None or not (config.device_cache_bytes or config.ram_cache_bytes):
        return
    hot = profile(config)
    tail = layer_tail(name)
    found = [] if hot is None else [t for t in hot if t == name or t.endswith(tail)]
    if len(found) > 1:
        raise EngramError(
            f"the profile {config.device_cache_profile} holds {len(found)} tables ending in {tail} ({', '.join(found[:3])}); profile this model with `engram profile --out`"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    among = len(hot) if hot is not None else tables  # the model's tables: the profile's, else vLLM's count
    keep_hot(config, [table], device, hot, among=among, profile_key=lambda _: found[0] if found else name)
