"""benchmarks/_bounds.py, against oracles written apart from it: the fewest misses any cache of a given size
can make on a small stream (every choice of what to keep, tried), an LRU by each item's last step, the rows
first asked for by sets, and a row's pages from its bytes."""

from __future__ import annotations

import functools
import itertools
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _bounds import FilePages, distinct, first_asked, hindsight, pages_per_step, recency


def fewest_misses(steps: list[frozenset[int]], capacity: int) -> int:
    """The fewest misses over the stream: after each step, any set of at most `capacity` of the items held
    or just asked for may be kept."""

    @functools.cache
    def best(i: int, held: frozenset[int]) -> int:
        if i == len(steps):
            return 0
        missed = len(steps[i] - held)
        pool = sorted(held | steps[i])
        keeps = (frozenset(c) for k in range(min(capacity, len(pool)) + 1) for c in itertools.combinations(pool, k))
        return missed + min(best(i + 1, keep) for keep in keeps)

    return best(0, frozenset())


@pytest.mark.parametrize("seed", range(40))
def test_hindsight_misses_as_few_as_any_choice(seed: int) -> None:
    rng = random.Random(seed)
    universe, capacity = rng.randint(3, 6), rng.randint(1, 3)
    steps = [frozenset(rng.sample(range(universe), rng.randint(1, 3))) for _ in range(rng.randint(3, 9))]
    misses = hindsight([np.array(sorted(s), dtype=np.int64) for s in steps], universe, capacity)
    assert sum(len(m) for m in misses) == fewest_misses(steps, capacity)
    first = set()
    for step, missed in zip(steps, misses, strict=True):  # a miss is an item of its step; every first ask misses
        assert set(missed.tolist()) <= step
        assert step - first <= set(missed.tolist())
        first |= step


def test_hindsight_with_room_for_all_misses_only_the_first_asks() -> None:
    rng = np.random.default_rng(3)
    steps = distinct([rng.integers(0, 50, 20) for _ in range(30)])
    misses = hindsight(steps, 50, 50)
    assert [m.tolist() for m in misses] == [m.tolist() for m in first_asked(steps, 50)]


def lru_misses(steps: list[list[int]], capacity: int) -> list[list[int]]:
    """An LRU kept as each item's last (step, place in its step's ascending order): after a step, all but
    the `capacity` latest are dropped."""
    last: dict[int, tuple[int, int]] = {}
    out = []
    for i, step in enumerate(steps):
        out.append([item for item in step if item not in last])
        last.update({item: (i, k) for k, item in enumerate(step)})
        last = dict(sorted(last.items(), key=lambda kv: kv[1])[-capacity:]) if capacity else {}
    return out


@pytest.mark.parametrize("seed", range(20))
def test_recency_misses_what_an_lru_by_last_step_misses(seed: int) -> None:
    rng = np.random.default_rng(seed)
    universe, capacity = int(rng.integers(5, 40)), int(rng.integers(0, 20))
    steps = distinct([rng.integers(0, universe, int(rng.integers(1, 12))) for _ in range(30)])
    misses = recency(steps, capacity)
    assert [m.tolist() for m in misses] == lru_misses([s.tolist() for s in steps], capacity)
    assert sum(map(len, misses)) >= sum(map(len, hindsight(steps, universe, capacity)))


def test_recency_with_room_for_all_misses_only_the_first_asks() -> None:
    rng = np.random.default_rng(5)
    steps = distinct([rng.integers(0, 50, 20) for _ in range(30)])
    assert [m.tolist() for m in recency(steps, 50)] == [m.tolist() for m in first_asked(steps, 50)]


def test_first_asked_is_what_no_earlier_step_asked() -> None:
    rng = np.random.default_rng(4)
    steps = distinct([rng.integers(0, 200, 64) for _ in range(20)])
    seen: set[int] = set()
    for items, first in zip(steps, first_asked(steps, 200), strict=True):
        assert first.tolist() == sorted(set(items.tolist()) - seen)
        seen |= set(items.tolist())


@pytest.mark.parametrize("row_bytes", [160, 256, 4096, 5000])
def test_a_rows_pages_are_those_its_bytes_lie_in(row_bytes: int) -> None:
    pages = FilePages(offsets=(24, 9000, 70_001), part_rows=10, row_bytes=row_bytes)
    rows = np.array([0, 1, 9, 10, 15, 29, 20], dtype=np.int64)
    expected = set()
    for row in rows.tolist():
        start = pages.offsets[row // 10] + (row % 10) * row_bytes
        expected |= {byte // 4096 for byte in range(start, start + row_bytes)}
    assert pages.of(rows).tolist() == sorted(expected)
    assert pages_per_step([rows, rows[:1]], pages) == [len(expected), len(pages.of(rows[:1]))]
    assert pages_per_step([rows], None) == [len(rows)]
