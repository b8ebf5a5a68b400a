"""The device cache inside vLLM (device_cache_bytes): each host table's hottest rows, from the profile
`engram profile --out` wrote (device_cache_profile), kept on the GPU by the table layer (Table.cache_rows);
hits read them there, misses read the host table over UVA, bit for bit the uncached lookup. The rank's
budget is split evenly over the profile's tables, as engram's engine splits it over the rank's. A table's
cache is built on its first lookup, when vLLM has loaded its weights (vLLM's profile run comes before any
CUDA graph capture). On vLLM's CPU platform the cache lives in host memory: the same lookups, for the tests."""

from __future__ import annotations

import torch

from engram.config import EngramConfig
from engram.errors import EngramError
from engram.integrations.vllm.files import layer_tail
from engram.runtime.table import Table, read_profile

_PROFILES: dict[str, dict[str, torch.Tensor]] = {}  # one read per profile file and process


def profile(config: EngramConfig) -> dict[str, torch.Tensor]:
    """The hot rows per table of the configured profile (read once); checked when the settings are."""
    path = config.device_cache_profile
    if path is None:
        raise EngramError(
            "engram setting 'device_cache_bytes' needs 'device_cache_profile': the hot rows `engram profile --out` wrote for this model"
        )
    if path not in _PROFILES:
        _PROFILES[path] = read_profile(path)
    return _PROFILES[path]


def keep_hot(config: EngramConfig | None, name: str, table: Table) -> None:
    """Give `table` (the rows this rank holds of the table vLLM names `name`) its device cache, when one is
    configured."""
    if config is None or not config.device_cache_bytes:
        return
    hot = profile(config)
    tail = layer_tail(name)
    found = [t for t in hot if t == name or t.endswith(tail)]
    if len(found) != 1:
        raise EngramError(
            f"engram device_cache_profile {config.device_cache_profile}: it should hold the hot rows of one table ending in {tail}, it holds {len(found)}; profile this model with `engram profile --out`"
        )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    table.cache_rows(hot[found[0]], config.device_cache_bytes // len(hot), device)
