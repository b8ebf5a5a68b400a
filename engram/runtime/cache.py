"""Hot rows of a host table kept in device memory (device_cache_bytes), chosen from a profile of real
text (engram profile). A lookup finds each id in the cache's sorted ids (torch.searchsorted: static
shapes, no host sync, capturable), reads hits from the cache and misses from the host table, and merges
the two: bit for bit the uncached lookup, since both read the same stored bytes through the same kernels.
DEAD_ID, rows of other shards and ids outside the table never hit (the cache holds only owned rows)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.ops import DEAD_ID, GatherCall
from engram.runtime.checkpoints.files import check_regular
from engram.runtime.checkpoints.loader import SafetensorsFile
from engram.runtime.placement.filemap import files_named_on_fault
from engram.runtime.placement.storage import TableShard


@dataclass(frozen=True)
class HotRows:
    """Cached rows of one shard: `ids` ascending global row ids, `weight` (and `scale`) their rows as stored."""

    ids: torch.Tensor
    weight: torch.Tensor
    scale: torch.Tensor | None


def read_profile(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """The hot rows per table ('<table>.hot_rows', most frequent first) of an `engram profile --out` file,
    read into private memory: never a view of a mapping of the file, which a rewrite under a running
    engine would turn into SIGBUS."""
    where = Path(path)
    check_regular(where, "the profile")  # a FIFO or a missing file, named as such
    try:
        file = SafetensorsFile(where)
        return {
            name.removesuffix(".hot_rows"): file.tensor(name) for name in file.entries if name.endswith(".hot_rows")
        }
    except EngramError as exc:
        raise EngramError(f"cannot read the profile {exc}; write one with `engram profile --out`") from None
    except (MemoryError, RuntimeError) as exc:  # a header claiming more rows than memory holds
        raise EngramError(
            f"cannot read the profile {where}: its hot rows do not fit in this process's memory "
            f"({str(exc).splitlines()[0][:120]}); write a smaller one with `engram profile --out`"
        ) from None


def build_cache(shard: TableShard, hot: torch.Tensor, budget_bytes: int, device: torch.device | str) -> HotRows | None:
    """The most frequent rows of `hot` that `shard` owns, as many as `budget_bytes` hold, copied to
    `device` (None when none fit or none are owned)."""
    if hot.dtype != torch.int64 or hot.dim() != 1:
        raise EngramError(
            f"{shard.name}: a profile's hot rows are a 1-D int64 tensor; got {hot.dtype} {list(hot.shape)}"
        )
    owned = hot[(hot >= shard.row_start) & (hot < shard.row_stop)]
    count = min(owned.numel(), budget_bytes // shard.format.row_bytes)
    if count == 0:
        return None
    chosen = torch.sort(owned[:count]).values
    if torch.unique(chosen).numel() != chosen.numel():
        raise EngramError(f"{shard.name}: the profile lists a row twice; write it again with `engram profile --out`")
    with files_named_on_fault(shard):
        weight = _rows(shard, shard.weight, chosen).to(device)
        scale = None if shard.scale is None else _rows(shard, shard.scale, chosen).to(device)
    return HotRows(chosen.to(device), weight, scale)


def _rows(shard: TableShard, part: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` (global ids) of a shard's weight or scale, as stored. Host rows are read by the guarded
    gather kernel, so a file-backed table whose file shrank is an error here too, never SIGBUS."""
    if part.device.type != "cpu":
        return part.index_select(0, rows.to(part.device) - shard.row_start)
    raw = part.view(torch.uint8) if part.dtype == torch.float8_e8m0fnu else part  # not a table dtype
    return GatherCall(raw, None, rows, shard.row_start, shard.row_stop, raw.dtype).run().view(part.dtype)


def cached_gather(cache: HotRows, call: GatherCall, counts: torch.Tensor | None = None) -> torch.Tensor:
    """`call` with its hits served from `cache` (whose weight and scale are the rows of `call`'s, in
    the same form): the same rows, bit for bit, into `call.out` when that is a buffer. `counts` (int64
    [2] on the cache's device): hits and ids looked up are added to it, on the device (no sync)."""
    flat = call.ids.reshape(-1).to(torch.int64)
    slot = torch.searchsorted(cache.ids, flat).clamp_(max=cache.ids.numel() - 1)
    hit = cache.ids[slot] == flat
    if counts is not None:
        counts[0] += hit.sum()
        counts[1] += hit.numel()
    shape, dtype = call.ids.shape, call.out_dtype
    slots = torch.where(hit, slot, DEAD_ID).view(shape)
    from_cache = GatherCall(
        cache.weight, cache.scale, slots, 0, cache.ids.numel(), dtype, table_scale=call.table_scale
    ).run()
    misses = torch.where(hit, DEAD_ID, flat).view(shape)  # an id outside the table never hits: the host path raises
    from_host = replace(call, ids=misses, out=dtype).run()
    rows = torch.where(hit.view(*shape, 1), from_cache, from_host)
    return rows if not isinstance(call.out, torch.Tensor) else call.out.copy_(rows)


def caches_for(
    shards: list[TableShard], profile: Mapping[str, torch.Tensor], budget_bytes: int, device: torch.device | str
) -> dict[str, HotRows]:
    """A cache per shard from the profile's hot rows, the rank's budget split evenly over its tables."""
    missing = sorted({s.name for s in shards} - set(profile))
    if missing:
        raise EngramError(
            f"the profile has no hot rows for {', '.join(missing)}; profile this model with `engram profile --out`"
        )
    share = budget_bytes // max(1, len(shards))
    built = {s.name: build_cache(s, profile[s.name], share, device) for s in shards}
    return {name: cache for name, cache in built.items() if cache is not None}
