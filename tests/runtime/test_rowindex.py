"""The RAM tier's index of held rows against a dict: any sequence of adds and removes (small batches, and
batches past the spare room that go straight to a rebuild), with rebuilds that move a few entries at a
time or all at once, leaves find, held_rows and held equal to the dict's, and its memory never grows."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.runtime import rowindex
from engram.runtime.rowindex import FREE, MIN_SPARE, RowIndex, spare_for

ROWS = 5000


@st.composite
def changes(draw: st.DrawFn) -> list[tuple[str, list[int]]]:
    """A sequence of ('add', rows) and ('remove', rows) that is valid for an index of 1,500 rows: batches
    of every size up to the room left (drawn from a seeded permutation, so large ones are as likely as
    small ones)."""
    held: set[int] = set()
    out = []
    for _ in range(draw(st.integers(1, 12))):
        seed = draw(st.integers(0, 2**31 - 1))
        if held and draw(st.booleans()):
            size = draw(st.sampled_from([1, 7, 300, len(held)]))
            order = torch.randperm(len(held), generator=torch.Generator().manual_seed(seed))
            rows = [sorted(held)[i] for i in order[: min(size, len(held))].tolist()]
            held -= set(rows)
            out.append(("remove", rows))
        else:
            room = 1500 - len(held)
            size = draw(st.sampled_from([0, 1, 7, 300, 1100, room]))
            fresh = [
                r for r in torch.randperm(ROWS, generator=torch.Generator().manual_seed(seed)).tolist() if r not in held
            ]
            rows = fresh[: min(size, room)]
            held |= set(rows)
            out.append(("add", rows))
    return out


@settings(max_examples=60, deadline=None)
@given(changes(), st.sampled_from([3, 64, 1 << 16]))
def test_the_index_answers_as_a_dict_does(steps: list[tuple[str, list[int]]], chunk: int) -> None:
    """`chunk`: the entries a rebuild moves at a time (REBUILD_CHUNK), a few and all at once."""
    with mock.patch.object(rowindex, "REBUILD_CHUNK", chunk):
        check_against_a_dict(steps)


def check_against_a_dict(steps: list[tuple[str, list[int]]]) -> None:
    index = RowIndex(1500)
    nbytes = index.nbytes
    oracle: dict[int, int] = {}
    free_slots = list(range(1500))
    for kind, rows in steps:
        if kind == "add":
            slots = [free_slots.pop() for _ in rows]
            index.add(torch.tensor(rows, dtype=torch.int64), torch.tensor(slots, dtype=torch.int64))
            oracle.update(zip(rows, slots, strict=True))
        else:
            index.remove(torch.tensor(rows, dtype=torch.int64))
            for row in rows:
                free_slots.append(oracle.pop(row))
        queries = torch.arange(-1, ROWS + 1)
        found, slot = index.find(queries)
        assert found.tolist() == [q in oracle for q in queries.tolist()]
        assert slot[found].tolist() == [oracle[q] for q in queries.tolist() if q in oracle]
        assert bool((slot[~found] == FREE).all())
        assert index.held_rows().tolist() == sorted(oracle) and index.held == len(oracle)
        assert index.nbytes == nbytes  # fixed memory, whatever the history


def test_its_memory_and_its_limits() -> None:
    assert spare_for(100) == MIN_SPARE and spare_for(1 << 20) == (1 << 20) // 16
    index = RowIndex(10)
    assert index.nbytes == (10 + MIN_SPARE) * 16
    index.add(torch.arange(10), torch.arange(10))
    with pytest.raises(EngramError, match="holds 10 rows; 11 asked"):
        index.add(torch.tensor([99]), torch.tensor([0]))
    index.clear()
    assert index.held == 0 and index.held_rows().numel() == 0 and not bool(index.find(torch.arange(10))[0].any())
    with pytest.raises(EngramError, match="at least one row"):
        RowIndex(0)
