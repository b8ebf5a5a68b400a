"""Tiers of hot rows that learn from the traffic: the sketch's bounds, the admission's choice against
its definition, rows in the slots bit-equal to the table's own bytes, lookups bit-equal to the uncached
ones across refreshes, the tier's state rewritten in place, counters reconciling with counts made
outside the code under test, and a RAM tier over a file-backed table reading only its misses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engram.errors import EngramError
from engram.memory.mapping import PAGE, madvise
from engram.ops import gather
from engram.runtime.cache import EMPTY_KEY
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.filemap import resident_rows
from engram.runtime.placement.residency import MADV_DONTNEED, drop_file_cache, page_resident, resident_bytes
from engram.runtime.plan import table_shards
from engram.runtime.sketch import DEPTH, SATURATED, FrequencySketch
from engram.runtime.table import Table
from engram.runtime.tables import open_tables
from engram.runtime.tier import Admission, capacity_for
from tests.runtime.conftest import SMALL, random_shard
from tests.runtime.reference import same_bits


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


def check_choice(admission: Admission, held_before: set[int], pool: torch.Tensor) -> None:
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
    admission = Admission(300, (100, 5100), half_life=4, window_ids=2000)
    for step in range(12):
        window = zipf_ids(generator, 6000, 2000, shift=0 if step < 6 else 2500)  # some outside [100, 5100)
        before = set(admission.keys[: admission.used].tolist())
        change = admission.refresh(window)
        owned = window[(window >= 100) & (window < 5100)]
        check_choice(admission, before, owned)
        held = set(admission.keys[: admission.used].tolist())
        assert set(change.admitted.tolist()) == held - before and change.evicted == len(before - held)


def test_warm_start_and_static_tiers() -> None:
    admission = Admission(3, (10, 20), policy="static")
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


def test_online_admission_follows_a_switch_of_domain() -> None:
    """Zipfian traffic whose hot rows move: the online tier's hit rate on the new rows comes back to what
    a tier holding exactly the new head would hit, where a static tier of the old head does not."""
    generator = torch.Generator().manual_seed(4)
    table_rows, capacity = 200_000, 2000
    admission = Admission(capacity, (0, table_rows), window_ids=20_000, half_life=4)
    static = Admission(capacity, (0, table_rows), policy="static")
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
    oracle = Admission(capacity, (0, table_rows), policy="static")
    distinct, counts = torch.unique(new[:300_000], return_counts=True)
    oracle.warm(distinct[torch.argsort(counts, descending=True, stable=True)])
    best = float(oracle.hits(tail).float().mean())
    assert float(admission.hits(tail).float().mean()) >= 0.9 * best
    assert float(static.hits(tail).float().mean()) < 0.5 * best


def test_a_ram_tier_over_a_file_backed_table(small_checkpoint: Path) -> None:
    """Hot rows of a file-backed table in RAM: lookups equal the loaded table's, the file is read only
    for the misses (with its page cache dropped, a lookup of held rows brings in no page), and the
    tier's bytes are exact."""
    plans = table_shards(SMALL, 0, 1)
    mapped = open_tables(SMALL, Checkpoint(small_checkpoint), "file", plans=plans, progress=False)[0]
    loaded = open_tables(SMALL, Checkpoint(small_checkpoint), "host", plans=plans, progress=False)[0]
    table, plain = Table(mapped, plans[0].table_rows), Table(loaded, plans[0].table_rows)
    budget = 500 * (mapped.format.row_bytes + 16) + 4000 * 16 + 4 * 4 * 16384  # 500 rows, the ring, the sketch
    assert table.keep_hot(budget, "cpu", "ram", window_ids=4000) == 500
    generator = torch.Generator().manual_seed(5)
    for _ in range(12):
        ids = zipf_ids(generator, plans[0].table_rows, 1024).view(128, 8)
        assert same_bits(table.lookup(ids), plain.lookup(ids))
    stats = table.stats().tier
    assert stats is not None and stats.tier == "ram" and stats.rows == 500 and stats.hits > 0
    tier = table.tier
    assert tier is not None
    table.refresh()  # now, not in the lookups below (a refresh reads the rows it admits from the file)
    for mapping in mapped.files:  # the file's pages out of the page cache
        madvise(mapping.addr, mapping.length, MADV_DONTNEED)
        assert mapping.path is not None and drop_file_cache(mapping.path, file_id=mapping.file_id)
    assert resident_bytes(mapped.files) == 0
    held = tier.rows.ids[: tier.admission.used].view(50, 10)
    assert same_bits(table.lookup(held), plain.lookup(held))
    assert resident_bytes(mapped.files) == 0  # all hits: not a page of the file was read
    misses = torch.tensor([[r for r in range(plans[0].table_rows) if r not in set(held.flatten().tolist())][:8]])
    read_before = table.stats().disk_bytes_read
    assert same_bits(table.lookup(misses), plain.lookup(misses)) and resident_bytes(mapped.files) > 0
    read = table.stats().disk_bytes_read - read_before  # /proc/self/io, against the pages now resident
    assert abs(read - resident_bytes(mapped.files)) <= 0.01 * resident_bytes(mapped.files), read
    rows_bytes = tier.rows.weight.numel() + (0 if tier.rows.scale is None else tier.rows.scale.numel())
    assert rows_bytes == 500 * mapped.format.row_bytes  # fp8 rows and ue8m0 scales: one byte each
    assert stats.bytes == rows_bytes + 500 * 16 + 4000 * 16 + 4 * 4 * 16384 == budget
    table.release()
    plain.release()


def test_rows_not_admissible_now_wait_counted() -> None:
    """A refresh admits only the rows `admissible` allows (a file's rows whose pages are resident); the
    others keep their counts and come in on a later refresh that allows them."""
    admission = Admission(8, (0, 100), window_ids=64)
    window = torch.tensor([3, 4, 5, 6, 3, 4, 5, 6])
    change = admission.refresh(window, lambda new: new % 2 == 0)
    assert sorted(change.admitted.tolist()) == [4, 6] and admission.keys[: admission.used].tolist() == [4, 6]
    change = admission.refresh(torch.tensor([7]), lambda new: torch.ones_like(new, dtype=torch.bool))
    assert admission.keys[: admission.used].tolist() == [4, 6, 7]
    change = admission.refresh(torch.tensor([3, 5]))
    assert admission.keys[: admission.used].tolist() == [3, 4, 5, 6, 7]
    assert admission.sketch is not None and admission.sketch.estimate(torch.tensor([3, 5])).tolist() == [3, 3]


def test_resident_rows_follow_the_page_cache(small_checkpoint: Path) -> None:
    """resident_rows against each row's pages probed one by one (page_resident), with the file's page
    cache dropped and then some rows read back."""
    plans = table_shards(SMALL, 0, 1)
    shard = open_tables(SMALL, Checkpoint(small_checkpoint), "file", plans=plans, progress=False)[0]
    for mapping in shard.files:
        madvise(mapping.addr, mapping.length, MADV_DONTNEED)
        assert mapping.path is not None and drop_file_cache(mapping.path, file_id=mapping.file_id)
    rows = plans[0].table_rows
    ids = torch.arange(rows)
    assert not resident_rows(shard, ids).any()
    Table(shard, rows).lookup(torch.tensor([[5, 6, 7, 2_000, 40_000]]))

    def pages_resident(row: int) -> bool:
        for part in (shard.weight, shard.scale):
            assert part is not None
            row_bytes = part.shape[1] * part.element_size()
            first, last = part.data_ptr() + row * row_bytes, part.data_ptr() + (row + 1) * row_bytes - 1
            if not all(page_resident(page * PAGE) for page in range(first // PAGE, last // PAGE + 1)):
                return False
        return True

    expected = [pages_resident(r) for r in range(rows)]
    assert resident_rows(shard, ids).tolist() == expected
    assert all(expected[r] for r in (5, 6, 7, 2_000, 40_000)) and not all(expected)
