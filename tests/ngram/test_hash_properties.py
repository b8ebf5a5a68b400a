"""The vectorised hashers (native and torch) against the scalar reference, on random inputs; chunked and
token-by-token against whole; ranges; the largest ids."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.ngram.hash import NgramHasher
from engram.ngram.layout import Layout, deepseek_layout, qwen_layout
from tests.ngram.reference import reference_rows

BACKENDS = ["native", "torch"]


@cache
def layouts() -> dict[str, Layout]:
    return {
        "deepseek": deepseek_layout((2, 0, 5), 4, 3, (50, 70, 90), 40, seed=0),
        "qwen": qwen_layout((1, 2), 3, 2, 100, 40, 16, seed=1234),
    }


EOS = 7  # a Qwen EOS id inside the small vocabulary


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, list[int], list[bool]]:
    family = draw(st.sampled_from(["deepseek", "qwen"]))
    ids = draw(st.lists(st.one_of(st.integers(0, 39), st.just(EOS)), max_size=40))
    dead = draw(st.lists(st.integers(0, 4).map(lambda v: v == 0), min_size=len(ids), max_size=len(ids)))
    return family, ids, dead


def hasher(family: str, backend: str) -> NgramHasher:
    fill = 3 if family == "deepseek" else EOS
    return NgramHasher(layouts()[family], fill, EOS if family == "qwen" else None, backend=backend)


def expected(family: str, ids: list[int], dead: list[bool]) -> list[list[list[int]]]:
    h = hasher(family, "torch")
    return reference_rows(h.layout, ids, dead, h.fill_id, h.eos_id)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=150, deadline=None)
@given(requests())
def test_equals_scalar_reference(backend: str, request_: tuple[str, list[int], list[bool]]) -> None:
    family, ids, dead = request_
    rows = hasher(family, backend).hash(torch.tensor(ids, dtype=torch.int64), torch.tensor(dead, dtype=torch.bool))
    assert rows.dtype == torch.int64
    assert rows.shape == (len(ids), len(layouts()[family].layer_ids), layouts()[family].columns)
    assert rows.tolist() == expected(family, ids, dead)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=100, deadline=None)
@given(requests(), st.lists(st.integers(1, 7), min_size=1, max_size=10))
def test_chunks_and_single_tokens_equal_whole(
    backend: str, request_: tuple[str, list[int], list[bool]], cuts: list[int]
) -> None:
    family, ids, dead = request_
    h = hasher(family, backend)
    whole = h.hash(torch.tensor(ids, dtype=torch.int64), torch.tensor(dead, dtype=torch.bool))
    for sizes in (cuts, [1]):  # random chunking, then token by token (decode)
        state, parts, at, i = h.new_state(), [], 0, 0
        while at < len(ids):
            size = sizes[i % len(sizes)]
            chunk = slice(at, at + size)
            rows, state = h.hash_with_state(
                torch.tensor(ids[chunk], dtype=torch.int64), torch.tensor(dead[chunk], dtype=torch.bool), state
            )
            parts.append(rows)
            at, i = at + size, i + 1
        joined = torch.cat(parts) if parts else whole.new_empty(whole.shape)
        assert joined.tolist() == whole.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["deepseek", "qwen"])
def test_every_id_in_its_heads_range(backend: str, family: str) -> None:
    h = hasher(family, backend)
    ids = torch.randint(0, 40, (2000,), generator=torch.Generator().manual_seed(1))
    rows = h.hash(ids)
    low = h.offsets.reshape(len(h.layout.layer_ids), -1)
    high = low + h.primes.reshape(len(h.layout.layer_ids), -1)
    assert bool((rows >= low).all()) and bool((rows < high).all())
    # every bucket of the first head is reachable: the hash spreads
    assert torch.unique(rows[:, 0, 0]).numel() == h.layout.primes[0, 0, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_largest_ids_do_not_overflow(backend: str) -> None:
    """With V' - 1 everywhere, every product is near 2^63: compare with exact integer arithmetic."""
    layout = deepseek_layout((1, 14), 4, 8, (16_000_000,) * 3, 99_092)
    h = NgramHasher(layout, 2, backend=backend)
    ids = [99_091, 99_091, 99_090, 99_091, 0, 99_091]
    rows = h.hash(torch.tensor(ids))
    assert rows.tolist() == reference_rows(layout, ids, [False] * 6, 2)
    assert int(rows.min()) >= 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs(backend: str) -> None:
    h = hasher("deepseek", backend)
    with pytest.raises(EngramError, match=r"compressed id 40 is outside \[0, 40\); compress raw token ids first"):
        h.hash(torch.tensor([1, 40]))
    with pytest.raises(EngramError, match="compressed id -1"):
        h.hash(torch.tensor([-1]))
    with pytest.raises(EngramError, match="1-D"):
        h.hash(torch.tensor([[1]]))
    with pytest.raises(EngramError, match="int64 or int32"):
        h.hash(torch.tensor([1.0]))
    with pytest.raises(EngramError, match=r"dead must be a bool tensor of shape \[2\]"):
        h.hash(torch.tensor([1, 2]), torch.tensor([True]))
    assert h.hash(torch.tensor([1, 2], dtype=torch.int32)).tolist() == h.hash(torch.tensor([1, 2])).tolist()
    assert h.hash(torch.tensor([], dtype=torch.int64)).shape == (0, 3, 9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_output_buffer(backend: str) -> None:
    h = hasher("deepseek", backend)
    ids = torch.tensor([1, 2, 3, 4])
    buffer = torch.full((4, 3, 9), -7, dtype=torch.int64)
    result = h.hash(ids, out=buffer)
    assert result.data_ptr() == buffer.data_ptr()
    assert buffer.tolist() == h.hash(ids).tolist() == expected("deepseek", [1, 2, 3, 4], [False] * 4)
    with pytest.raises(
        EngramError,
        match=r"out must be a contiguous int64 tensor of shape \[4, 3, 9\] on cpu, got torch.int64 \[5, 3, 9\] on cpu",
    ):
        h.hash(ids, out=torch.empty((5, 3, 9), dtype=torch.int64))
    with pytest.raises(EngramError, match="out must be"):
        h.hash(ids, out=torch.empty((4, 3, 9), dtype=torch.int32))
