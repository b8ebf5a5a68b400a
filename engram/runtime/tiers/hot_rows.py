"""Hot rows of a table kept in faster memory: device memory over a host table (device_cache_bytes), or
private RAM over a file-backed one (ram_cache_bytes). Which rows a tier holds is chosen by the tier
(engram.runtime.tiers: from the served traffic, or from a profile of real text). A lookup finds each id in the tier's sorted
ids (torch.searchsorted: static shapes, no host sync, capturable), reads hits from the tier's slots and
misses from the table, and merges the two: bit for bit the uncached lookup, since both read the same
stored bytes through the same kernels. DEAD_ID, rows of other shards and ids outside the table never hit
(a tier holds only owned rows)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engram.ops import DEAD_ID, GatherCall
from engram.ops.segments import Rows, dense
from engram.runtime.shard import TableShard
from engram.runtime.tiers.row_index import RowIndex

EMPTY_KEY = torch.iinfo(torch.int64).max  # an unused slot's id: above every row id, never looked up


@dataclass(frozen=True)
class HotRows:
    """Cached rows of one shard: `ids` ascending global row ids (EMPTY_KEY past the ones held), `weight`
    (and `scale`) rows as stored; the row of ids[i] is weight[slots[i]], or weight[i] where `slots` is None.
    A tier that learns rewrites all of these in place, so a captured graph reads its latest rows. A RAM
    tier, which changes rows on every lookup, finds them through its `index` instead (ids None)."""

    ids: torch.Tensor | None
    weight: torch.Tensor
    scale: torch.Tensor | None
    slots: torch.Tensor | None = None
    index: RowIndex | None = None

    def view(self, weight: torch.Tensor, scale: torch.Tensor | None) -> HotRows:
        """The same ids and slots over other views of the rows (their raw bytes, say)."""
        return replace(self, weight=weight, scale=scale)

    def locate(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether each of `flat` (int64) is held, and its slot (meaningless where not)."""
        if self.index is not None:
            return self.index.find(flat)
        assert self.ids is not None
        position, hit = find(self.ids, flat)
        return hit, position if self.slots is None else self.slots[position]


def stored_rows(shard: TableShard, part: Rows, rows: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Rows `rows` (global ids) of a shard's weight or scale, as stored, on `device`. Host rows are read
    by the guarded gather kernel, so a file-backed table whose file shrank is an error here too, never
    SIGBUS; a host table the GPU reads over UVA is gathered by the GPU, with no host copy."""
    if part.device.type != "cpu":
        return dense(part).index_select(0, rows.to(part.device) - shard.row_start).to(device)
    raw = part.view(torch.uint8) if part.dtype == torch.float8_e8m0fnu else part  # not a table dtype
    where = torch.device(device)
    if where.type == "cuda" and shard.device_pointer is not None:
        rows = rows.to(where)
    call = GatherCall(raw, None, rows, shard.row_start, shard.row_stop, raw.dtype)
    return call.run().view(part.dtype).to(where)


def find(ids: torch.Tensor, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each of `flat`'s position in the ascending `ids` (clamped inside it) and whether it is there."""
    position = torch.searchsorted(ids, flat).clamp_(max=ids.numel() - 1)
    return position, ids[position] == flat


def merge(
    rows: torch.Tensor, slots: torch.Tensor, more: torch.Tensor, more_slots: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ascending arrays of distinct rows (and their slots) as one: merged by where each falls in the
    other, not sorted again (a few rows join many)."""
    at = torch.searchsorted(more, rows) + torch.arange(rows.numel(), device=rows.device)
    at_more = torch.searchsorted(rows, more) + torch.arange(more.numel(), device=rows.device)
    merged, merged_slots = rows.new_empty(rows.numel() + more.numel()), slots.new_empty(rows.numel() + more.numel())
    merged[at], merged[at_more] = rows, more
    merged_slots[at], merged_slots[at_more] = slots, more_slots
    return merged, merged_slots


HIT_CHUNK = 16384  # hits copied over the misses this many at a time: a few MB of transient rows, not a prefill's
# What a tier's lookups add up, on the tier's device: hits, ids looked up, misses of rows the shard owns.
COUNTS = 3


def cached_gather(
    cache: HotRows, call: GatherCall, counts: torch.Tensor | None = None, owned: tuple[int, int] = (0, 0)
) -> torch.Tensor:
    """`call` with its hits served from `cache` (whose weight and scale are the rows of `call`'s, in
    the same form): the same rows, bit for bit, into `call.out` when that is a buffer. `counts` (int64
    [COUNTS] on the cache's device): hits, ids looked up and misses in the `owned` rows [start, stop) are
    added to it, on the device (no sync)."""
    flat = call.ids.reshape(-1).to(torch.int64)
    hit, slot = cache.locate(flat)
    if counts is not None:
        counts[0] += hit.sum()
        counts[1] += hit.numel()
        counts[2] += ((flat >= owned[0]) & (flat < owned[1]) & ~hit).sum()
    shape, dtype = call.ids.shape, call.out_dtype
    misses = torch.where(hit, DEAD_ID, flat).view(shape)  # an id outside the table never hits: the host path raises
    if not flat.is_cuda:  # the misses into the output, then the hits over them: no second full-size buffer
        rows = replace(call, ids=misses).run()  # (a prefill's transient copies would push a file's pages out)
        picked = hit.nonzero().squeeze(1)
        flat_rows = rows.view(flat.numel(), rows.shape[-1])  # [-1] is ambiguous for no ids (an idle replica)
        for start in range(0, picked.numel(), HIT_CHUNK):
            part = picked[start : start + HIT_CHUNK]
            flat_rows[part] = GatherCall(
                cache.weight, cache.scale, slot[part], 0, cache.weight.shape[0], dtype, table_scale=call.table_scale
            ).run()
        return rows
    slots = torch.where(hit, slot, DEAD_ID).view(shape)  # static shapes on a GPU: capturable
    from_cache = GatherCall(
        cache.weight, cache.scale, slots, 0, cache.weight.shape[0], dtype, table_scale=call.table_scale
    ).run()
    from_host = replace(call, ids=misses, out=dtype).run()
    rows = torch.where(hit.view(*shape, 1), from_cache, from_host)
    return rows if not isinstance(call.out, torch.Tensor) else call.out.copy_(rows)
