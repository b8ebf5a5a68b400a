"""What a tier's budget buys: its rows and its own state (the admission's ids, slots, ring and sketch, or
its index and bits), in bytes, and the most rows a budget holds."""

from __future__ import annotations

from typing import Literal

from engram.runtime.tiers.row_index import buckets_for
from engram.runtime.tiers.sketch import DEPTH, sketch_width

Policy = Literal["online", "static"]
POLICIES: tuple[Policy, ...] = ("online", "static")
TierName = Literal["device", "ram"]
WINDOW_IDS = 1 << 17  # ids served between refreshes: about 4k tokens of a table looked up at 32 columns
HALF_LIFE = 32  # windows between halvings of the sketch: about 128k tokens
MAX_SKETCH_WIDTH = 1 << 22  # 64 MiB of counters at most, per table


def width_for(capacity: int, window_ids: int, table_rows: int) -> int:
    """The sketch's width for a tier: room for the rows it holds and a window's ids, never more than the
    rows it can be asked about."""
    return min(MAX_SKETCH_WIDTH, sketch_width(min(table_rows, capacity + window_ids)))


def state_bytes(rows: int, table_rows: int, window_ids: int, policy: Policy, eager: bool) -> int:
    """Bytes of a tier's own state besides its rows: for a tier that admits after every lookup
    (the RAM tier's ClockAdmission) the index's hash table and each slot's row and referenced bit; else the ids and slots
    of the rows it holds, and online the ring of a window's ids and the sketch."""
    if eager:
        return buckets_for(rows) * 8 + rows * 5
    if policy != "online":
        return rows * 16
    return rows * 16 + window_ids * 16 + DEPTH * 4 * width_for(rows, window_ids, table_rows)


def tier_bytes(
    rows: int,
    row_bytes: int,
    table_rows: int,
    window_ids: int = WINDOW_IDS,
    policy: Policy = "online",
    eager: bool = False,
) -> int:
    """The bytes a tier holding `rows` rows takes: the rows and its own state (state_bytes)."""
    return rows * row_bytes + state_bytes(rows, table_rows, window_ids, policy, eager)


def capacity_for(
    budget_bytes: int,
    row_bytes: int,
    table_rows: int,
    window_ids: int = WINDOW_IDS,
    policy: Policy = "online",
    eager: bool = False,
) -> int:
    """The most rows (of a shard of `table_rows`) a tier of `budget_bytes` holds, its own state counted
    (state_bytes)."""
    per_row = row_bytes + 16

    def needs(rows: int) -> int:
        return tier_bytes(rows, row_bytes, table_rows, window_ids, policy, eager)

    low, high = 0, min(table_rows, max(0, budget_bytes) // per_row)  # needs(low) fits; the answer in [low, high]
    if needs(low) > budget_bytes:
        return 0
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if needs(middle) <= budget_bytes else (low, middle - 1)
    return low
