"""The device tier's choice (WindowedAdmission): every lookup's ids are kept in a window; between steps,
once a window was served, `refresh` counts it into a FrequencySketch (a count-min sketch halved every
`half_life` windows, so old traffic fades) and keeps the `capacity` rows of highest estimate among those
held and those just seen, a held row winning a tie (LFU with decay, as TinyLFU admits: a newcomer must
beat the row it evicts). The sorted ids and their slots are rewritten in place, so the mapping from row
to slot stays one device tensor whose address a captured graph keeps.

The frequency estimate sees every order of n-gram alike, and that is enough: bigram rows are looked up
far more often than 3- or 4-gram rows, so they win the slots without a rule of their own, and the long
tail of higher-order rows seen once never evicts a row seen twice. A profile (`engram profile --out`)
is an optional warm start; with policy "static" its rows are all the tier ever holds. `engram profile`'s
replay of a user's text runs this same class, so the hit rates it reports are those this code serves."""

from __future__ import annotations

import torch

from engram.errors import EngramError
from engram.runtime.tiers.budget import HALF_LIFE, WINDOW_IDS, Policy, width_for
from engram.runtime.tiers.choice import Change, owned_rows
from engram.runtime.tiers.hot_rows import EMPTY_KEY, find, merge
from engram.runtime.tiers.sketch import FrequencySketch


class WindowedAdmission:
    """Which rows of [row_start, row_stop) a tier of `capacity` rows holds: `keys` ascending (EMPTY_KEY
    past `used`) and `slots` their slots (a permutation of range(capacity), free slots last), both
    updated in place."""

    def __init__(
        self,
        capacity: int,
        rows: tuple[int, int],
        device: torch.device | str = "cpu",
        *,
        policy: Policy = "online",
        half_life: int = HALF_LIFE,
        window_ids: int = WINDOW_IDS,
    ) -> None:
        if capacity <= 0:
            raise EngramError(f"a tier holds at least one row, not {capacity}")
        self.capacity, self.rows, self.policy = capacity, rows, policy
        self.keys = torch.full((capacity,), EMPTY_KEY, dtype=torch.int64, device=device)
        self.slots = torch.arange(capacity, dtype=torch.int64, device=device)
        self.used = 0
        width = width_for(capacity, window_ids, rows[1] - rows[0])
        self.sketch = FrequencySketch(width, device, half_life=half_life) if policy == "online" else None

    @property
    def nbytes(self) -> int:
        """Bytes of the choice's own state: ids, slots and the sketch."""
        sketch = 0 if self.sketch is None else self.sketch.nbytes
        return self.keys.numel() * 16 + sketch

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> Change:
        """Hold the first rows of `hot` (global ids, most frequent first: a profile's) that are ours, as
        many as fit; rows held before are let go. `counts`: how often the profile saw each, counted into
        the sketch, so the traffic's rows must beat the profile's counts (decaying as any other) to evict
        them, the profile's coldest first."""
        owned, owned_counts = owned_rows(hot.to(self.keys.device), counts, self.rows, self.capacity)
        if owned_counts is not None and self.sketch is not None:
            self.sketch.add(owned, owned_counts)
        evicted = self.used
        slots = torch.arange(self.capacity, device=self.slots.device)
        self._set(owned[:0], slots[:0], owned, slots[: owned.numel()], slots[owned.numel() :])
        return Change(owned, slots[: owned.numel()], evicted)

    def refresh(self, window: torch.Tensor) -> Change:
        """Count the ids `window` served and keep the `capacity` rows of highest estimate among those held
        and those in the window (module docstring); a static tier changes nothing."""
        if self.sketch is None:
            return Change(window[:0], self.slots[:0], 0)
        window = window.reshape(-1).to(torch.int64)
        window = window[(window >= self.rows[0]) & (window < self.rows[1])]
        self.sketch.add(window)
        held, held_slots = self.keys[: self.used], self.slots[: self.used]
        seen = torch.unique(window)
        _, known = find(self.keys, seen)
        new = seen[~known]
        if self.used + new.numel() <= self.capacity:  # room for all: nothing competes
            slots = self.slots[self.used : self.used + new.numel()].clone()
            free = self.slots[self.used + new.numel() :].clone()
            self._set(held.clone(), held_slots.clone(), new, slots, free)
            return Change(new, slots, 0)
        score = torch.cat([self.sketch.estimate(held).long() * 2 + 1, self.sketch.estimate(new).long() * 2])
        top = torch.topk(score, min(self.capacity, score.numel()), sorted=False).indices
        keep = torch.zeros(self.used, dtype=torch.bool, device=held.device)
        keep[top[top < self.used]] = True
        admitted = new[top[top >= self.used] - self.used]
        free = torch.cat([held_slots[~keep], self.slots[self.used :]])
        slots = free[: admitted.numel()]
        evicted = self.used - int(keep.sum())
        self._set(held[keep], held_slots[keep], admitted, slots, free[admitted.numel() :])
        return Change(admitted, slots, evicted)

    def _set(
        self, kept: torch.Tensor, kept_slots: torch.Tensor, added: torch.Tensor, slots: torch.Tensor, free: torch.Tensor
    ) -> None:
        """Hold `kept` (ascending, in `kept_slots`) and `added` (any order, in `slots`), `free` the rest:
        keys and slots rewritten in place, sorted by id. The two are merged, not sorted again: a refresh
        admits few rows beside the many it keeps."""
        order = torch.argsort(added)
        ids, new_slots = merge(kept, kept_slots, added[order], slots[order])
        count = ids.numel()
        self.keys[:count] = ids
        self.keys[count:] = EMPTY_KEY
        self.slots[:count] = new_slots
        self.slots[count:] = free
        self.used = count

    def hits(self, ids: torch.Tensor) -> torch.Tensor:
        """Whether each id is held (a lookup's hits)."""
        return find(self.keys, ids.reshape(-1).to(torch.int64))[1]

    def held_rows(self) -> torch.Tensor:
        """The rows held, ascending."""
        return self.keys[: self.used]
