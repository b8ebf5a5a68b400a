"""Each lookup mode has its own reader, chosen when the table opens or gets a tier, holding what was
decided then: no reader tests a fact fixed at open (its tier or none, staged or not, a file on disk or
in memory) again on a call. Rows of every mode equal the table loaded into memory."""

from __future__ import annotations

import ast
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.lookup import DiskReader, FileReader, RamTierReader, Reader, TieredFileReader, TieredReader
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables
from engram.runtime.table import Table
from tests.runtime.specs import SMALL

LOOKUP = Path(__file__).resolve().parents[2] / "engram" / "runtime" / "lookup"
FIXED_AT_OPEN = ("self.tier", "self.shard.staged", "self.shard.readahead", "self.shard.files", "self.budget")


@pytest.fixture
def places(small_checkpoint: Path) -> Iterator[dict[str, Path]]:
    """SMALL's checkpoint on disk, and a copy of it on tmpfs."""
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    with tempfile.TemporaryDirectory(prefix="engram-test-", dir="/dev/shm") as directory:
        write_checkpoint(SMALL, Path(directory), seed=7)
        yield {"disk": small_checkpoint, "tmpfs": Path(directory)}


def table(checkpoint: Path, placement: str) -> Table:
    plans = table_shards(SMALL, 0, 1)
    shard = open_tables(SMALL, Checkpoint(checkpoint), placement, plans=plans, progress=False)[1]  # type: ignore[arg-type]
    return Table(shard, plans[1].table_rows)


@pytest.mark.parametrize(
    ("place", "placement", "tiered", "reader"),
    [
        ("disk", "host", False, Reader),
        ("disk", "host", True, TieredReader),
        ("tmpfs", "file", False, FileReader),
        ("tmpfs", "file", True, TieredFileReader),
        ("disk", "file", False, DiskReader),
        ("disk", "file", True, RamTierReader),
    ],
)
def test_each_mode_has_its_reader_and_serves_the_loaded_rows(
    places: dict[str, Path], place: str, placement: str, tiered: bool, reader: type, memory_short: None
) -> None:
    served, loaded = table(places[place], placement), table(places["disk"], "host")
    assert served.shard.readahead == (place == "disk" and placement == "file")  # the premise
    if tiered:
        assert served.keep_hot(1 << 20, "cpu", window_ids=256) > 0
    assert type(served.reader) is reader
    ids = torch.randint(0, served.table_rows, (64, 8), generator=torch.Generator().manual_seed(5))
    for _ in range(2):  # the second time, a tier's hits
        served.refresh()
        assert torch.equal(served.lookup(ids).view(torch.int16), loaded.lookup(ids).view(torch.int16))
    tier = served.stats().tier
    assert (tier is not None and tier.hits > 0) == tiered
    served.release()
    loaded.release()


def test_no_reader_tests_a_fact_fixed_at_open_on_a_call() -> None:
    found = []
    for path in sorted(LOOKUP.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
            tests += [value for value in getattr(node, "values", [])] if isinstance(node, ast.BoolOp) else []
            for test in tests:
                text = ast.unparse(test)
                found += [f"{path.name}:{node.lineno}: {text}" for fact in FIXED_AT_OPEN if fact in text]
    assert found == []
