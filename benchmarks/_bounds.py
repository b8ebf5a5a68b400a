"""What any cache could have read on a benchmark's stream of lookups: the bounds a tier's disk pages are
set against, computed from the stream itself in the same run.

- The rows first asked for (first_asked): in each step, the rows no earlier step asked for. A cache of
  rows that reads a row from the disk only when a lookup asks for it (every tier, whatever its memory or
  its choice of rows) reads at least their pages.
- Hindsight (hindsight): Belady's choice, with the whole stream known, in a memory of `capacity` items
  (rows, or pages for a page cache): on a miss, the item held that is asked for again last is evicted, or
  the one missed is not kept if it is asked for again later than all of them. It misses the fewest items a
  cache of that many can; no online choice knows the future, so none does better.
- Recency (recency): an LRU of `capacity` items, the choice online caches of rows approximate (the RAM
  tier's CLOCK among them): what it reads at the tier's size and at a multiple of it says how much memory
  recency alone would need to reach what hindsight reads.

Hashed n-gram ids land on rows unrelated to their neighbours, so a row first asked for shares its page
with rows of other n-grams: a page cache may hold that page by chance, a cache of rows never can.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from engram.memory.mapping import PAGE

NEVER = np.iinfo(np.int64).max  # the next step of an item not asked for again


@dataclass(frozen=True)
class FilePages:
    """Where a table's rows lie in its file: row r in part r // part_rows, at offsets[part] plus its place
    in that part."""

    offsets: tuple[int, ...]
    part_rows: int
    row_bytes: int

    def of(self, rows: np.ndarray) -> np.ndarray:
        """The distinct file pages that hold `rows` (a row across a page boundary, both of them)."""
        start = np.asarray(self.offsets, dtype=np.int64)[rows // self.part_rows]
        start += (rows % self.part_rows) * self.row_bytes
        first, last = start // PAGE, (start + self.row_bytes - 1) // PAGE
        spans = [first + k for k in range(int((last - first).max(initial=0)) + 1)]
        return np.unique(np.concatenate([np.minimum(page, last) for page in spans]))


def distinct(steps: list[np.ndarray]) -> list[np.ndarray]:
    """Each step's distinct ids, ascending."""
    return [np.unique(np.asarray(ids).reshape(-1)) for ids in steps]


def first_asked(steps: list[np.ndarray], universe: int) -> list[np.ndarray]:
    """The items of each step (distinct, below `universe`) that no earlier step asked for."""
    seen = np.zeros(universe, dtype=bool)
    out = []
    for items in steps:
        out.append(items[~seen[items]])
        seen[items] = True
    return out


def hindsight(steps: list[np.ndarray], universe: int, capacity: int) -> list[np.ndarray]:
    """The items each step misses (distinct, below `universe`) in a cache of `capacity` items that chooses
    with the whole stream known (module docstring). Items of the step that misses them are served by it
    whether kept or not."""
    ahead = np.full(universe, NEVER, dtype=np.int64)
    next_use = [np.empty(0, dtype=np.int64)] * len(steps)
    for i in range(len(steps) - 1, -1, -1):
        next_use[i] = ahead[steps[i]]
        ahead[steps[i]] = i
    held = np.full(universe, -1, dtype=np.int64)  # an item's next step while it is held, else -1
    latest: list[tuple[int, int]] = []  # (-next step, item), stale entries dropped when they surface
    count, out = 0, []
    for items, uses in zip(steps, next_use, strict=True):
        missed = held[items] < 0
        out.append(items[missed])
        for item, use in zip(items[~missed].tolist(), uses[~missed].tolist(), strict=True):  # hits first: their
            held[item] = use  # next steps decide what is evicted for the misses
            heapq.heappush(latest, (-use, item))
        for item, use in zip(items[missed].tolist(), uses[missed].tolist(), strict=True):
            if count >= capacity:
                while held[latest[0][1]] != -latest[0][0]:
                    heapq.heappop(latest)
                if -latest[0][0] <= use:  # every item held is asked for again sooner: this one is not kept
                    continue
                held[heapq.heappop(latest)[1]] = -1
                count -= 1
            held[item] = use
            heapq.heappush(latest, (-use, item))
            count += 1
    return out


def recency(steps: list[np.ndarray], capacity: int) -> list[np.ndarray]:
    """The items each step misses (distinct) in an LRU of `capacity` items: a step's items become the most
    recent (in ascending order), and the least recent go once more than `capacity` are held."""
    held: OrderedDict[int, None] = OrderedDict()
    out = []
    for items in steps:
        missed = []
        for item in items.tolist():
            if item in held:
                held.move_to_end(item)
            else:
                missed.append(item)
                held[item] = None
        while len(held) > capacity:
            held.popitem(last=False)
        out.append(np.array(missed, dtype=np.int64))
    return out


def pages_per_step(misses: list[np.ndarray], pages: FilePages | None) -> list[int]:
    """The pages each step's missed rows lie in (`pages`), or, with None, the misses themselves (pages)."""
    return [len(m) if pages is None else len(pages.of(m)) for m in misses]
