"""The device tier (device_cache_bytes over a table in memory): its windowed choice (the sketch, the
admission of the highest estimates, warm and static starts) against scalar oracles, its lookups bit-equal
to the table's, and its budget arithmetic."""

from __future__ import annotations

import logging

import pytest
import torch

from engram.errors import EngramError
from engram.ops import gather
from engram.runtime.table import Table
from engram.runtime.tiers import budget as budget_module
from engram.runtime.tiers.budget import capacity_for
from engram.runtime.tiers.hot_rows import EMPTY_KEY
from engram.runtime.tiers.sketch import DEPTH, SATURATED, FrequencySketch
from engram.runtime.tiers.windowed import WindowedAdmission
from tests.bits import same_bits
from tests.runtime.shards import random_shard


def zipf_ids(generator: torch.Generator, rows: int, count: int, shift: int = 0) -> torch.Tensor:
    """Zipfian ids over [0, rows), rank r at row (r * 7919 + shift) % rows: a shift is a domain switch."""
    weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64)
    ranks = torch.multinomial(weights, count, replacement=True, generator=generator)
    return (ranks * 7919 + shift) % rows


def test_the_sketch_never_underestimates_and_halves() -> None:
    generator = torch.Generator().manual_seed(1)
    sketch = FrequencySketch(1 << 12, half_life=3)
    assert sketch.nbytes == DEPTH * (1 << 12) * 4
    ids = zipf_ids(generator, 50_000, 20_000)
    sketch.add(ids)
    distinct, counts = torch.unique(ids, return_counts=True)
    estimate = sketch.estimate(distinct)
    assert bool((estimate >= counts).all())
    wide = FrequencySketch(1 << 16)
    wide.add(ids)  # 16 times the distinct ids: an id whose 4 counters all collide is rare
    assert float((wide.estimate(distinct) == counts).float().mean()) > 0.99
    before = sketch.counts.clone()
    sketch.add(ids[:0])
    sketch.add(ids[:0])  # the third addition halves first
    assert torch.equal(sketch.counts, before >> 1)
    with pytest.raises(ValueError, match="power of two"):
        FrequencySketch(3000)
    full = FrequencySketch(1 << 12)  # weighted counts saturate at the int32 maximum, never wrap
    big = torch.tensor([SATURATED - 5, SATURATED - 5])
    full.add(torch.tensor([7, 7]), big)
    full.add(torch.tensor([7]))
    assert int(full.estimate(torch.tensor([7]))[0]) == SATURATED and int(full.counts.min()) >= 0


def check_choice(admission: WindowedAdmission, held_before: set[int], pool: torch.Tensor) -> None:
    """The admission's state after a refresh, against its definition: ids ascending, EMPTY_KEY past the
    held ones, slots a permutation; held = min(capacity, pool) rows, and no row outside beats one inside
    (score: twice the estimate, plus one for a row held before)."""
    keys, slots, used = admission.keys, admission.slots, admission.used
    assert torch.equal(torch.sort(slots).values, torch.arange(admission.capacity))
    assert bool((keys[:used][1:] > keys[:used][:-1]).all()) and bool((keys[used:] == EMPTY_KEY).all())
    candidates = sorted(held_before | set(pool.tolist()))
    assert used == min(admission.capacity, len(candidates))
    assert admission.sketch is not None
    estimate = dict(zip(candidates, admission.sketch.estimate(torch.tensor(candidates)).tolist(), strict=True))

    def score(row: int) -> int:
        return 2 * estimate[row] + (row in held_before)

    held = set(keys[:used].tolist())
    outside = [score(r) for r in candidates if r not in held]
    if outside:
        assert min(score(r) for r in held) >= max(outside)


def test_admission_keeps_the_rows_of_highest_estimate() -> None:
    generator = torch.Generator().manual_seed(2)
    admission = WindowedAdmission(300, (100, 5100), half_life=4, window_ids=2000)
    for step in range(12):
        window = zipf_ids(generator, 6000, 2000, shift=0 if step < 6 else 2500)  # some outside [100, 5100)
        before = set(admission.keys[: admission.used].tolist())
        change = admission.refresh(window)
        owned = window[(window >= 100) & (window < 5100)]
        check_choice(admission, before, owned)
        held = set(admission.keys[: admission.used].tolist())
        assert set(change.admitted.tolist()) == held - before and change.evicted == len(before - held)


def test_warm_start_and_static_tiers() -> None:
    admission = WindowedAdmission(3, (10, 20), policy="static")
    change = admission.warm(torch.tensor([15, 2, 11, 19, 12]))  # 2 is another shard's row
    assert admission.keys.tolist() == [11, 15, 19] and change.admitted.tolist() == [15, 11, 19]
    assert admission.refresh(torch.tensor([12, 12, 12])).admitted.numel() == 0  # static: never changes
    assert admission.keys.tolist() == [11, 15, 19]
    with pytest.raises(EngramError, match="lists a row twice"):
        admission.warm(torch.tensor([11, 11]))
    shard = random_shard(10, "fp8", 1)
    with pytest.raises(EngramError, match="a static tier keeps a profile's rows"):
        Table(shard, 10).keep_hot(1 << 20, "cpu", policy="static")
    with pytest.raises(EngramError, match="a tier's policy is one of online, static, not 'lru'"):
        Table(shard, 10).keep_hot(1 << 20, "cpu", policy="lru")


@pytest.mark.parametrize("dtype", ["fp8", "bf16", "nvfp4"])
def test_online_lookups_equal_the_uncached_ones_and_counters_reconcile(dtype: str) -> None:
    generator = torch.Generator().manual_seed(3)
    rows, row_start, table_rows = 4000, 500, 5000
    shard = random_shard(rows, dtype, table_rows, row_start=row_start)
    table = Table(shard, table_rows)
    table_scale = None if shard.table_scale is None else float(shard.table_scale[0])
    budget = 200 * shard.format.row_bytes + 3000 * 16 + 4 * 4 * 8192  # 200 rows, the ring, the sketch
    capacity = table.keep_hot(budget, "cpu", window_ids=3000, half_life=3)
    tier = table.tier
    assert capacity == capacity_for(budget, shard.format.row_bytes, rows, 3000) and tier is not None
    fixed, per_row = 3000 * 16 + 4 * 4 * 8192, shard.format.row_bytes + 16  # a sketch of 4 x 8,192 counters
    assert fixed + capacity * per_row == tier.stats().bytes <= budget < fixed + (capacity + 1) * per_row
    pointers = (tier.admission.keys.data_ptr(), tier.admission.slots.data_ptr(), tier.rows.weight.data_ptr())
    hits = looked_up = owned_misses = 0
    for step in range(30):
        ids = zipf_ids(generator, table_rows, 64 * 8, shift=0 if step < 15 else 1700).view(64, 8)
        ids[0, :3] = torch.tensor([-1, 0, row_start - 1])  # DEAD_ID, and rows of another shard
        will_refresh = tier.due
        if will_refresh:
            table.refresh()
        held = tier.rows.ids[: tier.admission.used]
        hit = torch.isin(ids, held)
        owned = (ids >= row_start) & (ids < row_start + rows)
        hits, looked_up = hits + int(hit.sum()), looked_up + ids.numel()
        owned_misses += int((owned & ~hit).sum())
        want = gather(shard.weight, shard.scale, ids, row_start, table_rows, torch.bfloat16, table_scale=table_scale)
        got = table.lookup(ids)
        assert same_bits(got, want), step
        # every held row's slot holds the table's own stored bytes
        slot_rows = tier.rows.weight.view(torch.uint8)[tier.rows.slots[: held.numel()]]
        assert torch.equal(slot_rows, shard.weight.view(torch.uint8)[held - row_start])
    stats = table.stats().tier
    assert stats is not None and stats.refreshes >= 4
    assert (stats.hits, stats.lookups, stats.misses) == (hits, looked_up, looked_up - hits)
    assert stats.rows == tier.admission.used == stats.admissions - stats.evictions
    row_bytes = shard.format.row_bytes
    assert (stats.bytes_admitted, stats.bytes_hit, stats.bytes_missed) == (
        stats.admissions * row_bytes, hits * row_bytes, owned_misses * row_bytes
    )  # fmt: skip
    assert hits > looked_up // 4  # the Zipf head is served from the tier, after the switch too
    assert (tier.admission.keys.data_ptr(), tier.admission.slots.data_ptr(), tier.rows.weight.data_ptr()) == pointers
    none = table.lookup(torch.empty(0, 8, dtype=torch.int64))  # an idle replica's step: no ids, no rows
    assert none.shape == (0, 8, shard.format.dim) and none.dtype == torch.bfloat16


def test_online_admission_follows_a_switch_of_domain() -> None:
    """Zipfian traffic whose hot rows move: the online tier's hit rate on the new rows comes back to what
    a tier holding exactly the new head would hit, where a static tier of the old head does not."""
    generator = torch.Generator().manual_seed(4)
    table_rows, capacity = 200_000, 2000
    admission = WindowedAdmission(capacity, (0, table_rows), window_ids=20_000, half_life=4)
    static = WindowedAdmission(capacity, (0, table_rows), policy="static")
    old = zipf_ids(generator, table_rows, 200_000)
    static.warm(
        torch.unique(old, return_counts=True)[0][
            torch.argsort(torch.unique(old, return_counts=True)[1], descending=True)
        ]
    )
    for start in range(0, old.numel(), 20_000):
        admission.refresh(old[start : start + 20_000])
    new = zipf_ids(generator, table_rows, 400_000, shift=12345)
    for start in range(0, 300_000, 20_000):
        admission.refresh(new[start : start + 20_000])
    tail = new[300_000:]
    oracle = WindowedAdmission(capacity, (0, table_rows), policy="static")
    distinct, counts = torch.unique(new[:300_000], return_counts=True)
    oracle.warm(distinct[torch.argsort(counts, descending=True, stable=True)])
    best = float(oracle.hits(tail).float().mean())
    assert float(admission.hits(tail).float().mean()) >= 0.9 * best
    assert float(static.hits(tail).float().mean()) < 0.5 * best


@pytest.mark.parametrize("budget", [1, 1 << 20, 8 << 20])
def test_a_budget_too_small_for_one_row_says_the_smallest_that_holds_one(
    budget: int, caplog: pytest.LogCaptureFixture
) -> None:
    """An online device tier's own state (its window's ring and its sketch) takes a few MiB before it holds
    a row: a budget below that gives no tier and one warning naming the smallest budget that holds a row,
    which does hold one, where one byte less does not."""
    shard = random_shard(1 << 20, "fp8", seed=3, dim=256)
    table = Table(shard, 1 << 20)
    smallest = budget_module.tier_bytes(1, shard.format.row_bytes, shard.rows)
    with caplog.at_level(logging.WARNING, logger="engram"):
        held = table.keep_hot(budget, "cpu")
    if budget >= smallest:
        assert held > 0 and table.tier is not None and caplog.records == []
        return
    assert held == 0 and table.tier is None
    assert [r.getMessage() for r in caplog.records] == [
        f"engram: {shard.name} gets no device tier of hot rows: its {budget:,} bytes hold no row once the tier's "
        f"own state is paid; give its tier at least {smallest:,} bytes (the rank's budget is split over its "
        "tables), or 0 for none"
    ]
    assert capacity_for(smallest, shard.format.row_bytes, shard.rows) == 1
    assert capacity_for(smallest - 1, shard.format.row_bytes, shard.rows) == 0
    assert Table(shard, 1 << 20).keep_hot(smallest, "cpu") == 1
