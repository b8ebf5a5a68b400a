"""The resident-set budget of file-backed tables (file_cache_bytes, engram.runtime.placement.residency):
lookups over a table several times the budget keep its page cache near the bound, measured with mincore,
and return the same rows; in a memory cgroup whose limit the table exceeds, the budgeted process never
meets the limit where the unbudgeted one keeps running into it (cgroup v1, where this machine can make one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engram.memory.mapping import PAGE
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement import residency
from engram.runtime.placement.file_reads import READAHEAD_GAP, read_ahead, watch_files
from engram.runtime.placement.filemap import file_shard, in_memory_fs
from engram.runtime.placement.residency import (
    ResidentBudget,
    drop_file_cache,
    merged,
    outside,
    page_spans,
    resident_bytes,
    resident_pages,
)
from engram.runtime.shard import ShardFormat
from tests.runtime.placement.budget_table import BUDGET, CGROUP, COLUMNS, DIM, ROWS, open_table, table


def test_lookups_keep_the_page_cache_near_the_budget(tmp_path: Path) -> None:
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    directory = table(tmp_path)
    module, budget = open_table(directory, BUDGET)
    assert budget is not None
    weight = load_file(directory / "model.safetensors")["t.weight"].clone()  # a copy: no mapping of the file
    generator = torch.Generator().manual_seed(5)
    step_bytes = 1024 * COLUMNS * 2 * PAGE  # what one lookup can bring in: a page (two, unaligned) per row
    budget.release()  # written just now: the whole table is in the page cache
    for _ in range(12):
        ids = torch.randint(0, ROWS, (1024, COLUMNS), generator=generator)
        rows = module(ids)
        assert resident_bytes(budget.mappings) <= BUDGET + step_bytes
        assert torch.equal(rows.view(torch.int16), weight[ids].view(torch.int16))
    assert budget.trims >= 1 and budget.peak <= BUDGET + step_bytes


def warm_measures(directory: Path) -> int:
    """Measures taken by forty warm lookups of 512 rows under BUDGET, after one cold lookup."""
    module, budget = open_table(directory, BUDGET)
    assert budget is not None
    budget.release()  # the page cache of the file from earlier work: out
    ids = torch.randint(0, ROWS, (64, COLUMNS), generator=torch.Generator().manual_seed(9))
    want = module(ids)  # cold: reads its rows' pages, 2 to 4 MiB
    assert budget.measures == 0
    for _ in range(40):
        assert torch.equal(module(ids).view(torch.int16), want.view(torch.int16))
    assert budget.trims == 1 and budget.resident <= 4 << 20  # only the release above
    return budget.measures


def test_lookups_whose_pages_are_resident_seldom_measure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measure reads a byte for every page of the files, so it is taken only when the lookups since the
    last could have crossed the budget: a cold lookup counts the bytes its read-ahead asked for, and one
    whose probes all hit a sixteenth of the most its rows can touch (512 ids x 3 pages x 4 KiB x 2 / 16 =
    768 KiB, a measure every 17 or so warm lookups). Counting the most for every lookup measures at every
    other one."""
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    directory = table(tmp_path)
    assert warm_measures(directory) == 2
    monkeypatch.setattr(residency, "RESIDENCY_PROBES", 1)  # a warm lookup counted as the most it can add
    assert warm_measures(directory) == 20


def resident_set(budget: ResidentBudget) -> set[int]:
    (mapping,) = budget.mappings
    return {mapping.addr + i * PAGE for i, r in enumerate(resident_pages(mapping.addr, mapping.length)) if r}


def test_a_release_keeps_the_pages_of_the_latest_lookup(tmp_path: Path) -> None:
    """Past the budget, the pages of each table's latest lookup stay (when they fit in half the budget)
    and every other page goes: the next step that asks for the same rows finds them resident."""
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    directory = table(tmp_path)
    module, budget = open_table(directory, BUDGET)
    assert budget is not None and module.table.shard.files
    budget.release()  # nothing looked up yet: every page goes
    assert resident_set(budget) == set()
    generator = torch.Generator().manual_seed(11)
    earlier, latest = (torch.randint(0, ROWS, (64, COLUMNS), generator=generator) for _ in range(2))
    module(earlier)
    want = module(latest)
    spans = page_spans(module.table.weight, 0, latest).tolist()
    pages = {page for start, stop in spans for page in range(start, stop, PAGE)}
    assert len(pages) * PAGE <= BUDGET // 2 and not pages >= resident_set(budget)  # the earlier rows are in too
    budget.release()
    assert resident_set(budget) == pages  # the latest lookup's pages, exactly
    assert read_ahead(module.table.shard, latest) is None  # its probes all hit: nothing to read
    assert torch.equal(module(latest).view(torch.int16), want.view(torch.int16))

    budget.budget = len(pages) * PAGE  # now the latest lookup is more than half of the budget
    budget.release()
    assert resident_set(budget) == set()


def test_a_budget_watches_each_file_once_whatever_the_tables_of_it(tmp_path: Path) -> None:
    """Two tables that are views of one file put one mapping under the budget, counted once, and the
    span of a row's read is the widest table's (its row, the coalescing gap, one page for misalignment)."""
    weights = {"a.weight": torch.zeros(64, DIM, dtype=torch.bfloat16), "b.weight": torch.zeros(64, 4 * DIM)}
    save_file(weights, str(tmp_path / "model.safetensors"))
    checkpoint = Checkpoint(tmp_path)
    a = file_shard("a", ShardFormat(64, DIM, "bf16"), 0, 64, checkpoint, None)
    b = file_shard("b", ShardFormat(64, 4 * DIM, "fp32"), 0, 64, checkpoint, None)
    budget = ResidentBudget(1 << 20)
    watch_files(budget, a)
    watch_files(budget, b)
    watch_files(budget, a)
    assert budget.mappings == a.files == b.files and len(budget.mappings) == 1
    assert budget.resident == resident_bytes(a.files)
    assert budget.page_span == (4 * DIM * 4 + READAHEAD_GAP + PAGE - 1) // PAGE + 1


def test_outside_and_merged_ranges() -> None:
    spans = torch.tensor([[40, 50], [0, 10], [10, 20], [45, 60], [70, 80]])
    assert merged(spans).tolist() == [[0, 20], [40, 60], [70, 80]]
    assert outside(merged(spans), 0, 100) == [(20, 40), (60, 70), (80, 100)]
    assert outside(merged(spans), 15, 75) == [(20, 40), (60, 70)]
    assert outside(merged(spans[:0]), 5, 9) == [(5, 9)]
    assert outside(torch.tensor([[0, 100]]), 10, 20) == []


CHILD = """
import json, os, sys
cgroup, directory, budget = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
import torch
sys.path.insert(0, {root!r})
from tests.runtime.placement.budget_table import COLUMNS, ROWS, open_table
from pathlib import Path
module, _ = open_table(Path(directory), budget)
generator = torch.Generator().manual_seed(7)
for _ in range(40):  # 4,096 rows a lookup (at most 16 MiB of pages before the budget is checked); 40 touch nearly every page
    module(torch.randint(0, ROWS, (512, COLUMNS), generator=generator))
print(json.dumps({{"ok": True}}))
"""


def cgroup_run(directory: Path, budget: int, limit: int) -> dict[str, int]:
    """Run the lookups in a fresh memory cgroup of `limit` bytes; its failcnt and peak usage."""
    drop_file_cache(directory / "model.safetensors")  # else the pages are charged to whoever read them first
    group = CGROUP / f"engram-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        root = str(Path(__file__).resolve().parents[3])
        done = subprocess.run(
            [sys.executable, "-c", CHILD.format(root=root), str(group), str(directory), str(budget)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1]) == {"ok": True}, done.stderr[-2000:]
        return {
            "failcnt": int((group / "memory.failcnt").read_text()),
            "peak": int((group / "memory.max_usage_in_bytes").read_text()),
        }
    finally:
        group.rmdir()


def test_a_table_bigger_than_a_memory_limit_stays_under_it_with_a_budget(tmp_path: Path) -> None:
    if not os.access(CGROUP, os.W_OK) or not (CGROUP / "memory.limit_in_bytes").exists():
        pytest.skip("needs a writable cgroup v1 memory controller to set a memory limit")
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    directory = table(tmp_path)
    probe = cgroup_run(directory, BUDGET, 1 << 40)  # no limit: what the process needs besides the table
    limit = probe["peak"] + (48 << 20)  # the table (96 MiB) does not fit under it
    budgeted = cgroup_run(directory, BUDGET, limit)
    unbounded = cgroup_run(directory, 0, limit)
    assert budgeted["failcnt"] == 0 and budgeted["peak"] < limit
    assert unbounded["failcnt"] > 0  # ran into the limit: the kernel had to reclaim under it


@pytest.mark.parametrize("change", ["unlinked", "fifo", "dev-zero"])
def test_a_checkpoint_replaced_under_a_budget_keeps_serving_its_rows(tmp_path: Path, change: str) -> None:
    directory = table(tmp_path)
    weight = load_file(directory / "model.safetensors")["t.weight"].clone()
    module, budget = open_table(directory, BUDGET)
    assert budget is not None
    path = directory / "model.safetensors"
    path.unlink()  # the mapping keeps the inode: the rows stay those of the file that was mapped
    if change == "fifo":
        os.mkfifo(path)  # opening it for the page cache's sake would wait for a writer forever
    elif change == "dev-zero":
        path.symlink_to("/dev/zero")
    generator = torch.Generator().manual_seed(9)
    for _ in range(6):  # past the budget: each release would open the name again
        ids = torch.randint(0, ROWS, (1024, COLUMNS), generator=generator)
        assert torch.equal(module(ids).view(torch.int16), weight[ids].view(torch.int16))
    assert budget.trims >= 1
    assert drop_file_cache(path, file_id=budget.mappings[0].file_id) is False
