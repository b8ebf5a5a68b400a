"""file_reads.reading with the read-ahead asked for on a worker thread (behind=True), as a RAM tier's lookup
reads its misses: the rows read meanwhile are the file's, the budget is told what asking first tells it,
a body's error leaves only once the requests are made, and a forked child asks on a thread of its own."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engram.errors import EngramError
from engram.memory.mapping import madvise
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement import file_reads
from engram.runtime.placement.file_reads import reading, watch_files
from engram.runtime.placement.filemap import file_shard, in_memory_fs
from engram.runtime.placement.residency import MADV_DONTNEED, ResidentBudget, drop_file_cache
from engram.runtime.shard import ShardFormat, TableShard
from tests.runtime.placement.budget_table import DIM, ROWS, table


@pytest.fixture
def shard(tmp_path: Path) -> TableShard:
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs: its files are never read ahead")
    shard = file_shard("t", ShardFormat(ROWS, DIM, "bf16"), 0, ROWS, Checkpoint(table(tmp_path)), None)
    assert shard.readahead
    return shard


def drop(shard: TableShard) -> None:
    """The file's pages out of our mapping and the page cache: the next read-ahead asks for every one."""
    for mapping in shard.files:
        madvise(mapping.addr, mapping.length, MADV_DONTNEED)
        drop_file_cache(mapping.path or "")


def some_ids(seed: int) -> torch.Tensor:
    return torch.randint(0, ROWS, (512,), generator=torch.Generator().manual_seed(seed)).unique()


def test_behind_reads_the_files_rows_and_tells_the_budget_what_asking_first_does(shard: TableShard) -> None:
    want = load_file(shard.files[0].path)["t.weight"].clone()  # safetensors' reader; a copy: no mapping
    ids = some_ids(1)
    told = []
    for behind in (False, True):
        drop(shard)
        budget = ResidentBudget(1 << 40)
        watch_files(budget, shard)
        with reading(shard, ids, budget, behind=behind):
            got = shard.weight[ids].clone()  # in address order, as a tier's admission copies
        assert torch.equal(got.view(torch.int16), want[ids].view(torch.int16))
        told.append(budget.unmeasured)
    assert told[0] == told[1] >= ids.numel() * DIM * 2  # every row's bytes asked for, once each way


def test_a_body_error_leaves_only_once_the_requests_are_made(
    shard: TableShard, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = threading.Event()

    def slow_ask_for(shard: TableShard, flat: torch.Tensor) -> None:
        time.sleep(0.2)  # still asking when the body fails
        made.set()

    monkeypatch.setattr(file_reads, "ask_for", slow_ask_for)
    drop(shard)  # cold: there is something to ask for
    with pytest.raises(ValueError, match="the body's"), reading(shard, some_ids(2), behind=True):
        raise ValueError("the body's")
    assert made.is_set()


def test_a_disk_that_does_not_answer_is_named(shard: TableShard, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_reads, "READAHEAD_TIMEOUT_S", 0.05)
    monkeypatch.setattr(file_reads, "WAIT_MARGIN_S", 0)
    monkeypatch.setattr(file_reads, "ask_for", lambda shard, flat: time.sleep(0.5))
    drop(shard)
    named = re.escape(f"{shard.files[0].path}: the disk took over 0.05 s to answer; check the device (dmesg)")
    with pytest.raises(EngramError, match=named), reading(shard, some_ids(5), behind=True):
        pass


def test_a_forked_child_asks_on_a_thread_of_its_own(shard: TableShard) -> None:
    """The parent's read-ahead thread is not in a forked child; a child that queued its requests for it
    would wait forever (here: until the alarm kills it)."""
    drop(shard)  # cold: the parent asks on its thread, which has been idle since
    with reading(shard, some_ids(3), behind=True):
        pass
    assert file_reads._readers and all(thread._threads for thread in file_reads._readers.values())
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(60)
            drop(shard)
            with reading(shard, some_ids(4), behind=True):
                pass
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 120
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child's read-ahead never ran"
