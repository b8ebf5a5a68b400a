"""The sorted, deduplicated gather (each distinct row read once, in address order) equals the plain gather
bit for bit through the CPU twin; its C contract is checked before anything is written."""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.ops import OUT_KINDS, cpu, gather, sort_ids
from tests.bits import same_bytes
from tests.runtime.shards import random_shard


@settings(max_examples=80, deadline=None)
@given(
    shard_rows=st.integers(0, 40),
    row_start=st.integers(0, 30),
    dtype=st.sampled_from(["fp8", "bf16", "fp32"]),
    ids=st.lists(st.integers(-1, 79), max_size=200),
    distinct=st.integers(1, 6),
    id_dtype=st.sampled_from([torch.int64, torch.int32]),
)
def test_sorted_equals_plain(
    shard_rows: int, row_start: int, dtype: str, ids: list[int], distinct: int, id_dtype: torch.dtype
) -> None:
    """Duplicates galore (ids folded onto a few values), DEAD_ID, rows of other shards, empty batches."""
    shard = random_shard(shard_rows, dtype, shard_rows * 7 + row_start)
    folded = torch.tensor([i if i < 0 else i % (distinct * 13) for i in ids], dtype=id_dtype).view(-1, 1)
    out_dtype = torch.bfloat16 if dtype == "fp8" else shard.weight.dtype
    plain = gather(shard.weight, shard.scale, folded, row_start, 80, out_dtype)
    sorted_rows = gather(shard.weight, shard.scale, folded, row_start, 80, out_dtype, True)
    assert sorted_rows.shape == (len(ids), 1, 64) and same_bytes(sorted_rows, plain)


@pytest.mark.parametrize("value", [-1, 0, 17, 99])
def test_every_id_equal(value: int) -> None:
    shard = random_shard(50, "fp8", 3)
    ids = torch.full((1000,), value)
    sorted_rows = gather(shard.weight, shard.scale, ids, 50, 100, torch.float32, True)
    assert same_bytes(sorted_rows, gather(shard.weight, shard.scale, ids, 50, 100, torch.float32))
    bits = sorted_rows.view(torch.int32)
    assert bool((bits == bits[0]).all())  # one row read, copied everywhere (NaNs included)


def test_sort_ids_marks_each_run_with_its_first_index() -> None:
    ordered, order, leader = sort_ids(torch.tensor([5, -1, 5, 3, 5, -1]))
    assert ordered.tolist() == [-1, -1, 3, 5, 5, 5]
    assert torch.equal(torch.tensor([5, -1, 5, 3, 5, -1])[order], ordered)
    assert leader.tolist() == [0, 0, 2, 3, 3, 3]
    empty = sort_ids(torch.empty(0, dtype=torch.int64))
    assert [t.numel() for t in empty] == [0, 0, 0]


def test_out_of_range_ids_raise_in_the_sorted_form() -> None:
    shard = random_shard(10, "bf16", 1, dim=32)
    with pytest.raises(EngramError, match=r"row id 10 is outside the table's 10 rows"):
        gather(shard.weight, None, torch.tensor([3, 10, 3]), 0, 10, torch.bfloat16, True)
    with pytest.raises(EngramError, match=r"row id -2 is outside the table's 10 rows"):
        gather(shard.weight, None, torch.tensor([-2, 4]), 0, 10, torch.bfloat16, True)


def call_cpu(
    weight: torch.Tensor, ids: torch.Tensor, order: torch.Tensor, leader: torch.Tensor, out: torch.Tensor
) -> int:
    library = cpu.cpu_library()
    assert library is not None
    bad = ctypes.c_int64(0)
    status = library.engram_gather_cpu(
        weight.data_ptr(), None, weight.shape[0], weight.shape[1], weight.shape[1] * weight.element_size(), 0,
        weight.shape[0], cpu.ptr(ids), cpu.ptr(order), cpu.ptr(leader), ids.numel(), out.data_ptr(), 0, 0, 1.0,
        ctypes.byref(bad), 1,
    )  # fmt: skip
    return int(status)


@pytest.mark.parametrize(
    ("ids", "order", "leader"),
    [
        ([3, 1, 5], [0, 1, 2], [0, 1, 2]),  # not sorted
        ([1, 3, 3], [0, 1, 1], [0, 1, 1]),  # order not a permutation: a row would stay unwritten
        ([1, 3, 3], [0, 1, 3], [0, 1, 1]),  # order out of range: a write past the output
        ([1, 3, 3], [0, 1, 2], [0, 1, 2]),  # leader says a new run where the id repeats
        ([1, 3, 4], [0, 1, 2], [0, 1, 1]),  # leader says a repeat where the id changes
        ([1, 3, 3], [0, 1, 2], [0, 1, 7]),  # leader out of range: a read past the output
    ],
)
def test_the_c_contract_is_checked_before_any_write(ids: list[int], order: list[int], leader: list[int]) -> None:
    weight = torch.arange(8 * 16, dtype=torch.uint8).view(8, 16)
    out = torch.full((3, 16), 0xA5, dtype=torch.uint8)
    status = call_cpu(weight, torch.tensor(ids), torch.tensor(order), torch.tensor(leader), out)
    assert status == 1  # ENGRAM_ERR_ARGUMENT
    assert bool((out == 0xA5).all())  # nothing written
    good = call_cpu(weight, torch.tensor([1, 3, 3]), torch.tensor([2, 0, 1]), torch.tensor([0, 1, 1]), out)
    assert good == 0 and torch.equal(out, weight[[3, 3, 1]])
    assert set(OUT_KINDS.values()) == {1, 2}
