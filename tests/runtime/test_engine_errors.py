"""EngramTables.check_errors as it runs on a GPU, simulated on the CPU: while a stream captures it never
waits on an event (CUDA forbids it), and the kernels' error flags are read after every kind of call (eager
lookups, graph replays, prefetches, direct EngramEmbedding calls), not only after an eager lookup."""

from __future__ import annotations

import pytest
import torch

from engram.errors import EngramError
from engram.ops import cuda
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.engine import EngramTables, RankGroups
from engram.runtime.plan import TableShardPlan
from tests.runtime.shards import random_shard

COLUMNS = 4


class CaptureForbidsWaiting:
    """A CUDA event as it behaves while a stream captures: waiting on it is not permitted."""

    def __init__(self) -> None:
        self.waited = 0

    def synchronize(self) -> None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.waited += 1


def gpu_tables() -> EngramTables:
    """One layer's tables as EngramTables.build makes them on cuda:0, with the lookups run on the CPU."""
    shard = random_shard(64, "bf16", seed=3, dim=32)
    plan = TableShardPlan("t", 64, "row", 0, 64, 0, COLUMNS)
    layer = EngramEmbedding(shard, plan, columns=COLUMNS)
    return EngramTables(
        plan=None,  # type: ignore[arg-type]
        rank_plan=None,  # type: ignore[arg-type]
        groups=RankGroups(None, None, None),
        shards=[shard],
        layers=[layer],
        device=torch.device("cuda", 0),
    )


@pytest.fixture
def flag(monkeypatch: pytest.MonkeyPatch) -> torch.Tensor:
    """cuda:0's error flag, as plain host memory (pinning needs a GPU)."""
    flag = torch.zeros(len(cuda.FLAG_MESSAGES), dtype=torch.int32)
    monkeypatch.setattr(cuda, "_flags", {0: flag})
    return flag


def capturing(monkeypatch: pytest.MonkeyPatch, value: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: value)


def test_a_lookup_captured_after_an_eager_one_does_not_wait_on_the_eager_event(
    monkeypatch: pytest.MonkeyPatch, flag: torch.Tensor
) -> None:
    tables = gpu_tables()
    rows = torch.randint(0, 64, (5, 1, COLUMNS))
    eager_event = CaptureForbidsWaiting()
    tables._pending = eager_event  # type: ignore[assignment]
    capturing(monkeypatch, True)
    captured = tables.lookup(rows)  # raised "operation not permitted when stream is capturing" before
    assert torch.equal(captured[0].view(torch.int16), tables.layers[0](rows[:, 0]).view(torch.int16))
    assert eager_event.waited == 0 and tables._pending is eager_event  # still owed, for the next eager check
    capturing(monkeypatch, False)
    tables.check_errors()
    assert eager_event.waited == 1 and tables._pending is None


@pytest.mark.parametrize("slot", [cuda.FLAG_ROW_ID, cuda.FLAG_TOKEN_ID])
def test_a_flag_raised_by_a_replay_prefetch_or_direct_call_is_reported_with_nothing_pending(
    monkeypatch: pytest.MonkeyPatch, flag: torch.Tensor, slot: int
) -> None:
    tables = gpu_tables()
    capturing(monkeypatch, False)
    tables.check_errors()  # nothing flagged: quiet
    flag[slot] = 1  # what a kernel writes for a bad id, with no eager lookup behind it
    assert tables._pending is None
    expected = cuda.FLAG_MESSAGES[slot].format(device="cuda:0")
    with pytest.raises(EngramError) as raised:
        tables.check_errors()
    assert str(raised.value) == expected
    assert flag.tolist() == [0, 0]  # cleared
    tables.check_errors()


def test_a_flag_raised_during_capture_is_read_without_waiting(
    monkeypatch: pytest.MonkeyPatch, flag: torch.Tensor
) -> None:
    tables = gpu_tables()
    tables._pending = CaptureForbidsWaiting()  # type: ignore[assignment]
    capturing(monkeypatch, True)
    flag[cuda.FLAG_ROW_ID] = 1
    with pytest.raises(EngramError, match=r"^a gather on cuda:0 was given a row id outside its table"):
        tables.lookup(torch.zeros((1, 1, COLUMNS), dtype=torch.int64))


def test_cpu_tables_never_touch_the_gpu_flags(flag: torch.Tensor) -> None:
    tables = gpu_tables()
    tables.device = torch.device("cpu")
    flag[0] = 1
    tables.check_errors()  # CPU lookups raise at once; the GPU's flag is not theirs
    assert flag[0] == 1


def test_release_waits_for_the_gpu_before_unmapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefetch in flight reads the tables: the GPU is synchronised before any shard is released."""
    tables = gpu_tables()
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append(f"synchronize {device}"))
    shard = tables.shards[0]
    release = shard.release
    monkeypatch.setattr(shard, "release", lambda: (events.append("release"), release())[1])
    tables.release()
    assert events == ["synchronize cuda:0", "release"] and tables.layers == []
