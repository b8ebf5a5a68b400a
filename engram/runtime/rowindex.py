"""Which rows a host tier holds and in which of its slots, for a tier that changes a few rows on every
lookup (the RAM tier): a sorted array of rows and a small sorted array of the rows added since the large
one was last rebuilt, both searched with torch.searchsorted. A removed row keeps its place in the large
array with its slot set to FREE, so removing costs no copy; the large array is rebuilt from both once the
small one is full or FREE entries pile up (every `spare` changes, about one in sixteen of the capacity), so
a change costs O(spare) and the rebuild O(capacity) once per `spare` changes, where keeping one sorted
array would cost O(capacity) on every lookup. Host memory only: searched, changed and rebuilt on the CPU."""

from __future__ import annotations

import torch

from engram.errors import EngramError

EMPTY = torch.iinfo(torch.int64).max  # an unused entry's row: above every row id, never looked up
FREE = -1  # the slot of a removed row, whose entry stays until the next rebuild
MIN_SPARE = 1024
REBUILD_CHUNK = 1 << 16  # entries a rebuild moves at a time: 2 MB of temporaries


def spare_for(capacity: int) -> int:
    """Entries of the small array (and FREE entries of the large one) between rebuilds."""
    return max(MIN_SPARE, capacity // 16)


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


class RowIndex:
    """Rows held -> slots, for at most `capacity` rows (module docstring). Its memory is fixed: int64
    rows and slots for capacity + spare entries."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise EngramError(f"a tier holds at least one row, not {capacity}")
        self.capacity, self.spare = capacity, spare_for(capacity)
        self.rows = torch.full((capacity,), EMPTY, dtype=torch.int64)  # ascending; FREE slots are removed rows
        self.slots = torch.full((capacity,), FREE, dtype=torch.int64)
        self.added = torch.full((self.spare,), EMPTY, dtype=torch.int64)  # ascending: rows added since
        self.added_slots = torch.full((self.spare,), FREE, dtype=torch.int64)
        self.filled = 0  # entries of `rows` in use, FREE ones included
        self.count = 0  # entries of `added` in use
        self.removed = 0  # FREE entries in rows[:filled]
        self.held = 0

    def clear(self) -> None:
        """Hold nothing."""
        self._rebuild()
        self.rows[: self.filled], self.slots[: self.filled] = EMPTY, FREE
        self.filled = self.held = 0

    @property
    def nbytes(self) -> int:
        return (self.rows.numel() + self.slots.numel() + self.added.numel() + self.added_slots.numel()) * 8

    def find(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Whether each of `ids` (int64, any shape, flattened) is held, and its slot (FREE where not)."""
        flat = ids.reshape(-1)
        slot = torch.full_like(flat, FREE)
        for rows, slots, used in ((self.rows, self.slots, self.filled), (self.added, self.added_slots, self.count)):
            if used:
                at = torch.searchsorted(rows[:used], flat).clamp_(max=used - 1)
                found = rows[at] == flat  # a removed row is found with its slot FREE
                slot = torch.where(found, slots[at], slot)
        return slot != FREE, slot

    def held_rows(self) -> torch.Tensor:
        """The rows held, ascending."""
        live = self.rows[: self.filled][self.slots[: self.filled] != FREE]
        return torch.sort(torch.cat([live, self.added[: self.count]])).values

    def remove(self, rows: torch.Tensor) -> None:
        """Let go of `rows` (each held, distinct)."""
        if not rows.numel():
            return
        at = torch.searchsorted(self.rows[: self.filled], rows).clamp_(max=max(0, self.filled - 1))
        in_large = (
            (self.rows[at] == rows) & (self.slots[at] != FREE)
            if self.filled
            else torch.zeros_like(rows, dtype=torch.bool)
        )
        self.slots[at[in_large]] = FREE
        self.removed += int(in_large.sum())
        rest = rows[~in_large]
        if rest.numel():
            keep = ~torch.isin(self.added[: self.count], rest)
            kept = int(keep.sum())
            if self.count - kept != rest.numel():
                raise EngramError(f"the tier's index lost {rest.numel() - (self.count - kept)} of the rows it removes")
            self._set_added(self.added[: self.count][keep], self.added_slots[: self.count][keep])
        self.held -= rows.numel()

    def add(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        """Hold `rows` (distinct, none held) in `slots`."""
        if not rows.numel():
            return
        if self.held + rows.numel() > self.capacity:
            raise EngramError(f"the tier's index holds {self.capacity:,} rows; {self.held + rows.numel():,} asked")
        if self.count + rows.numel() > self.spare or self.removed + self.count >= self.spare:
            self._rebuild()
        if self.count + rows.numel() > self.spare:  # more than a rebuild's room at once: straight into the large array
            self._rebuild(rows, slots)
        else:
            order = torch.argsort(rows)
            self._set_added(*merge(self.added[: self.count], self.added_slots[: self.count], rows[order], slots[order]))
        self.held += rows.numel()

    def _set_added(self, rows: torch.Tensor, slots: torch.Tensor) -> None:
        self.count = rows.numel()
        self.added[: self.count], self.added_slots[: self.count] = rows, slots
        self.added[self.count :], self.added_slots[self.count :] = EMPTY, FREE

    def _rebuild(self, rows: torch.Tensor | None = None, slots: torch.Tensor | None = None) -> None:
        """One sorted array of every row held (and `rows` in `slots`), the small one emptied. In place and
        REBUILD_CHUNK entries at a time, so that its temporaries stay a few MB (and the small array's, and
        `rows`') whatever the capacity: the FREE entries squeezed out front to back, then the added rows
        merged in back to front (every entry moves right, past those still to move)."""
        kept = 0
        for start in range(0, self.filled, REBUILD_CHUNK):  # a write never passes the next read
            stop = min(self.filled, start + REBUILD_CHUNK)
            live = self.slots[start:stop] != FREE
            chunk_rows, chunk_slots = self.rows[start:stop][live], self.slots[start:stop][live]
            self.rows[kept : kept + chunk_rows.numel()], self.slots[kept : kept + chunk_rows.numel()] = (
                chunk_rows,
                chunk_slots,
            )
            kept += chunk_rows.numel()
        added, added_slots = self.added[: self.count].clone(), self.added_slots[: self.count].clone()
        if rows is not None and slots is not None:
            order = torch.argsort(rows)
            added, added_slots = merge(added, added_slots, rows[order], slots[order])
        at_added = torch.searchsorted(self.rows[:kept], added) + torch.arange(added.numel())
        for stop in range(kept, 0, -REBUILD_CHUNK):
            start = max(0, stop - REBUILD_CHUNK)
            chunk_rows, chunk_slots = self.rows[start:stop].clone(), self.slots[start:stop].clone()
            at = torch.arange(start, stop) + torch.searchsorted(added, chunk_rows)
            self.rows[at], self.slots[at] = chunk_rows, chunk_slots
        self.rows[at_added], self.slots[at_added] = added, added_slots
        self.filled = kept + added.numel()
        self.rows[self.filled :], self.slots[self.filled :] = EMPTY, FREE
        self.removed = 0
        self._set_added(self.added[:0], self.added_slots[:0])
