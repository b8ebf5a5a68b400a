"""The RAM tier's index of held rows (a native hash table) against a dict: any sequence of adds and
removes, in tables small enough that every probe collides and wraps round the end, leaves find and held
equal to the dict's, and its memory never grows. The kernels behind it refuse what would send them past
their arrays (a table too small to end a probe, slots past the capacity, rows of another shard) with an
error, not a crash, and write nothing then."""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.ops import cpu
from engram.runtime.tiers.clock import CLEAR, PINNED, SET
from engram.runtime.tiers.row_index import EMPTY, FREE, LOAD, RowIndex, buckets_for

START, ROWS = 1000, 5000  # the shard's global rows [START, START + ROWS)


@st.composite
def changes(draw: st.DrawFn, capacity: int) -> list[tuple[str, list[int]]]:
    """A sequence of ('add', rows) and ('remove', rows) valid for an index of `capacity` rows: batches of
    every size up to the room left, drawn from seeded permutations of the shard's rows."""
    held: set[int] = set()
    out = []
    for _ in range(draw(st.integers(1, 12))):
        generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
        if held and draw(st.booleans()):
            size = min(len(held), draw(st.sampled_from([1, 2, 7, 300, len(held)])))
            order = torch.randperm(len(held), generator=generator)[:size].tolist()
            rows = [sorted(held)[i] for i in order]
            held -= set(rows)
            out.append(("remove", rows))
        else:
            room = capacity - len(held)
            size = min(room, draw(st.sampled_from([0, 1, 7, 300, 1100, room])))
            fresh = [START + r for r in torch.randperm(ROWS, generator=generator).tolist() if START + r not in held]
            rows = fresh[:size]
            held |= set(rows)
            out.append(("add", rows))
    return out


@st.composite
def histories(draw: st.DrawFn) -> tuple[int, list[tuple[str, list[int]]]]:
    capacity = draw(st.sampled_from([1, 2, 3, 7, 64, 1500]))
    return capacity, draw(changes(capacity))


@settings(max_examples=80, deadline=None)
@given(histories())
def test_the_index_answers_as_a_dict_does(history: tuple[int, list[tuple[str, list[int]]]]) -> None:
    capacity, steps = history
    index = RowIndex(capacity, (START, START + ROWS))
    nbytes = index.nbytes
    oracle: dict[int, int] = {}
    free_slots = list(range(capacity))
    queries = torch.arange(-1, START + ROWS + 2)  # DEAD_ID, other shards' rows on both sides, all of ours
    for kind, rows in steps:
        if kind == "add":
            slots = [free_slots.pop() for _ in rows]
            index.add(torch.tensor(rows, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64))
            oracle.update(zip(rows, slots, strict=True))
        else:
            index.remove(torch.tensor(rows, dtype=torch.int64))
            for row in rows:
                free_slots.append(oracle.pop(row))
        found, slot = index.find(queries)
        assert found.tolist() == [q in oracle for q in queries.tolist()]
        assert slot[found].tolist() == [oracle[q] for q in queries.tolist() if q in oracle]
        assert bool((slot[~found] == FREE).all())
        assert index.held == len(oracle) and int((index.table != EMPTY).sum()) == len(oracle)
        assert index.nbytes == nbytes  # fixed memory, whatever the history


def test_its_memory_and_its_limits() -> None:
    assert buckets_for(10) == 15 and buckets_for(1) == 2  # over capacity / LOAD: a probe ends
    assert buckets_for(1 << 20) > (1 << 20) / LOAD
    index = RowIndex(10, (0, 100))
    assert index.nbytes == 15 * 8
    index.add(torch.arange(10), torch.arange(10))
    with pytest.raises(EngramError, match="holds 10 rows; 11 asked"):
        index.add(torch.tensor([99]), torch.tensor([0]))
    index.clear()
    assert index.held == 0 and not bool(index.find(torch.arange(10))[0].any())
    with pytest.raises(EngramError, match="at least one row"):
        RowIndex(0, (0, 100))
    with pytest.raises(EngramError, match="shard the table over more ranks"):
        RowIndex(10, (0, 3 << 31))


def test_a_misused_index_is_an_error_and_writes_nothing() -> None:
    index = RowIndex(4, (100, 200))
    index.add(torch.tensor([100, 150]), torch.tensor([0, 1]))
    before = index.table.clone()
    cases = [
        (lambda: index.add(torch.tensor([160, 99]), torch.tensor([2, 3])), "id outside the table"),  # another shard's
        (lambda: index.add(torch.tensor([160, 161]), torch.tensor([2, 4])), "invalid argument"),  # slot past capacity
        (lambda: index.remove(torch.tensor([151])), "invalid argument"),  # not held
        (lambda: index.remove(torch.tensor([200])), "id outside the table"),
    ]
    for call, reason in cases:
        with pytest.raises(EngramError, match=reason):
            call()
        assert torch.equal(index.table, before) and index.held == 2
    with pytest.raises(EngramError, match="invalid argument"):  # held already
        index.add(torch.tensor([150]), torch.tensor([2]))


def test_the_kernels_refuse_a_table_that_would_send_them_past_its_end() -> None:
    """A table with no empty bucket (a probe would never end), one smaller than its capacity, and an entry
    naming a slot past the capacity: each an error, never a read or write past the arrays."""
    library = cpu.cpu_library()
    assert library is not None
    ids = torch.arange(0, 8, dtype=torch.int64)
    slots = torch.empty_like(ids)

    def find(table: torch.Tensor, buckets: int, capacity: int) -> int:
        return library.engram_tier_find(cpu.ptr(table), buckets, 0, 8, capacity, cpu.ptr(ids), 8, cpu.ptr(slots))

    full = torch.tensor([(row << 32) | row for row in range(4)], dtype=torch.int64)
    assert find(full, 4, 3) == 1  # no bucket empty: the probe for a row not held would never end
    assert find(full, 4, 4) == 1 and find(full, 0, 1) == 1  # buckets must outnumber the slots
    home = ((3 * 0x9E3779B97F4A7C15 % 2**64) >> 32) * 5 >> 32  # where row 3's probe starts (tier_cpu.c)
    past = torch.full((5,), EMPTY, dtype=torch.int64)
    past[home] = (3 << 32) | 9  # row 3 in slot 9 of a 4-slot tier
    assert find(past, 5, 4) == 1
    past[home] = (3 << 32) | 2
    assert find(past, 5, 4) == 0 and slots.tolist() == [FREE, FREE, FREE, 2, FREE, FREE, FREE, FREE]
    assert library.engram_tier_find(cpu.ptr(past), 5, 0, 8, 4, None, 3, cpu.ptr(slots)) == 1  # n ids, no array


def test_the_sweep_passes_pinned_slots_and_refuses_what_it_cannot_do() -> None:
    library = cpu.cpu_library()
    assert library is not None
    state = torch.tensor([SET, CLEAR, SET, CLEAR], dtype=torch.uint8)
    victims = torch.empty(4, dtype=torch.int64)
    hand = ctypes.c_int64(0)

    def sweep(count: int, at: int = 0) -> int:
        hand.value = at
        return library.engram_clock_sweep(state.data_ptr(), 4, ctypes.byref(hand), count, cpu.ptr(victims))

    assert sweep(2) == 0 and victims[:2].tolist() == [1, 3] and hand.value == 0
    assert state.tolist() == [CLEAR, PINNED, CLEAR, PINNED]  # set bits passed are cleared, victims pinned
    state.copy_(torch.tensor([SET, SET, SET, SET], dtype=torch.uint8))
    assert sweep(4, at=2) == 0 and victims.tolist() == [2, 3, 0, 1] and hand.value == 2  # a lap clears, then takes
    state.copy_(torch.tensor([PINNED, SET, PINNED, SET], dtype=torch.uint8))
    assert sweep(2) == 0 and victims[:2].tolist() == [1, 3] and state.tolist() == [PINNED] * 4  # passed as they are
    state[1] = CLEAR
    assert sweep(2) == 1 and state.tolist() == [PINNED, CLEAR, PINNED, PINNED]  # one short: none taken
    state[1] = PINNED
    before = state.clone()
    assert sweep(1) == 1  # every slot pinned: nothing to take, and no endless sweep
    assert sweep(1, at=4) == 1 and sweep(-1) == 1 and sweep(5) == 1 and torch.equal(state, before)


def test_without_the_cpu_kernels_a_ram_tier_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "cpu_library", lambda: None)
    monkeypatch.setattr(cpu, "unavailable_reason", lambda: "no C compiler (install cc, or set CC)")
    with pytest.raises(EngramError, match=r"a RAM tier \(ram_cache_bytes\) needs engram's CPU kernels: no C compiler"):
        RowIndex(10, (0, 100))
