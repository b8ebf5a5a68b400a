"""Large CPU outputs are recycled (engram.memory.outputs) only when nothing else can see them: a caller's
reference, a view, or a C++ holder keeps an output out of reuse; a dropped one comes back, faulted in."""

from __future__ import annotations

import pytest
import torch

from engram.memory import outputs
from engram.ops import DEAD_ID, gather

SHAPE = (262144, 128)  # 64 MiB of bf16: past MIN_BYTES


@pytest.fixture(autouse=True)
def empty_pool() -> None:
    outputs._kept.clear()


def test_a_dropped_output_comes_back_and_a_held_one_never_does() -> None:
    first = outputs.empty_cpu(SHAPE, torch.bfloat16)
    address = first.data_ptr()
    del first
    again = outputs.empty_cpu(SHAPE, torch.bfloat16)
    assert again.data_ptr() == address  # dropped: the same memory, already faulted in
    other = outputs.empty_cpu(SHAPE, torch.bfloat16)
    assert other.data_ptr() != again.data_ptr()  # `again` is held
    assert outputs.empty_cpu((4, 4), torch.bfloat16).data_ptr() not in (again.data_ptr(), other.data_ptr())


@pytest.mark.parametrize("holder", ["view", "list", "future"])
def test_anything_that_can_still_read_an_output_keeps_it_out_of_reuse(holder: str) -> None:
    out = outputs.empty_cpu(SHAPE, torch.bfloat16)
    address = out.data_ptr()
    kept: object
    if holder == "view":
        kept = out[1:]
    elif holder == "list":
        kept = [out]
    else:  # a C++ holder of the tensor, with no Python reference to it
        kept = torch.futures.Future()
        kept.set_result(out)  # type: ignore[attr-defined]
    del out
    assert outputs.empty_cpu(SHAPE, torch.bfloat16).data_ptr() != address
    assert kept is not None


def test_outputs_of_changing_sizes_share_the_kept_memory() -> None:
    """A serving loop whose output size changes every step (prefill chunks, a tier's hits) keeps about
    its largest output, not one block per size: a smaller output lies in the kept one, a larger one
    replaces it."""
    rows = [262144, 200000, 131073, 262144, 300000, 150000, 299999, 280000]
    addresses = []
    for count in rows:
        out = outputs.empty_cpu((count, 128), torch.bfloat16)
        addresses.append(out.data_ptr())
        assert out.shape == (count, 128) and out.is_contiguous()
        out.fill_(1.0)  # every byte of it is ours to write
        del out
    kept = [t.untyped_storage().nbytes() for t in outputs._kept.values()]
    assert kept == [300000 * 128 * 2]  # the largest size asked, once
    assert len(set(addresses[:4])) == 1 and len(set(addresses[4:])) == 1  # each grown once, then reused
    held = outputs.empty_cpu((150000, 128), torch.bfloat16)
    other = outputs.empty_cpu((150000, 128), torch.bfloat16)  # the kept one is held: a new one
    assert other.data_ptr() != held.data_ptr() and len(outputs._kept) == 2


def test_the_pool_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "RECYCLED_BYTES", 3 * 64 << 20)
    held = [outputs.empty_cpu(SHAPE, torch.bfloat16) for _ in range(5)]
    assert len(outputs._kept) == 3 and all(id(t) in outputs._kept for t in held[2:])


def test_a_recycled_gather_output_holds_this_calls_rows() -> None:
    """Every row of a reused output is written again: dead ids and other shards' rows as zeros too."""
    table = torch.randn(1000, 128).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (262144,), generator=torch.Generator().manual_seed(0))
    ids[::7] = DEAD_ID
    first = gather(table, None, ids, 0, 1000, torch.bfloat16)
    address = first.data_ptr()
    first.fill_(3.0)
    del first
    second = gather(table, None, ids, 0, 1000, torch.bfloat16)
    assert second.data_ptr() == address
    want = table.index_select(0, ids.clamp(min=0))
    want[ids == DEAD_ID] = 0
    assert torch.equal(second.view(torch.int16), want.view(torch.int16))
