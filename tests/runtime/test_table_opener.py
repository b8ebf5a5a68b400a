"""The config's decisions for a process's tables, made in one place (engram.runtime.table_opener) for the
engine and both engine plugins: the placement, the checkpoint's one resident-set budget, node sharing's
mode, and each tier's kind and budget split (ram_cache_bytes and device_cache_bytes split over the tables,
over an engine's count of them when it gives them one at a time, over a profile's count when one is given),
checked against Table.keep_hot called with the arithmetic of the config's documentation; and no user of the
table layer deciding any of them itself."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engram.config import EngramConfig, load_config
from engram.integrations import model_tables
from engram.runtime.shard import ShardFormat
from engram.runtime.table import Table
from engram.runtime.table_opener import TableOpener, lookup_device

ROWS, DIM = 256, 16
NAMES = ("layers.1.ple", "layers.2.ple", "layers.3.ple")
FORMAT = ShardFormat(ROWS, DIM, "bf16")
ENGRAM = Path(__file__).resolve().parents[2] / "engram"


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint directory of three bf16 tables."""
    generator = torch.Generator().manual_seed(11)
    save_file(
        {f"{n}.weight": torch.randn(ROWS, DIM, generator=generator).to(torch.bfloat16) for n in NAMES},
        tmp_path / "model.safetensors",
    )
    return tmp_path


def config(**fields: object) -> EngramConfig:
    return load_config({"cpu_offload": True, **fields}, env={})


def file_tables(opener: TableOpener) -> list[Table]:
    return [opener.table(n, FORMAT, "file", table_rows=ROWS) for n in NAMES]


def capacity_alone(checkpoint: Path, budget_bytes: int) -> int:
    """The rows a RAM tier of `budget_bytes` holds over one of these tables, given by Table.keep_hot itself."""
    [table] = file_tables(TableOpener(config(file_backed=True), checkpoint=checkpoint))[:1]
    return table.keep_hot(budget_bytes, "cpu", "ram", policy="online")


def test_the_device_is_the_platforms() -> None:
    assert lookup_device("cpu") == torch.device("cpu")
    assert lookup_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("fields", "shareable", "expected"),
    [
        ({"cpu_offload": False}, True, "device"),
        ({"file_backed": True}, True, "file"),
        ({"node_sharing": "node"}, True, "node"),
        ({"dp_shared_memory": True}, True, "shm"),
        ({"dp_shared_memory": True}, False, "host"),
        ({"use_thp": True}, True, "hugepages"),
        ({}, True, "host"),
    ],
)
def test_the_placement_is_the_configs_on_this_device(fields: dict[str, object], shareable: bool, expected: str) -> None:
    assert TableOpener(config(**fields), device=torch.device("cpu")).placement(shareable=shareable) == expected


def test_file_backed_tables_are_the_checkpoints_rows_under_one_budget(checkpoint: Path) -> None:
    opener = TableOpener(config(file_backed=True, file_cache_bytes=1 << 20), checkpoint=checkpoint)
    tables = file_tables(opener)
    assert opener.budget is not None and opener.budget.budget == 1 << 20
    assert all(t.budget is opener.budget for t in tables)
    written = load_file(checkpoint / "model.safetensors")
    ids = torch.tensor([[0, ROWS - 1], [17, 3]])
    for name, table in zip(NAMES, tables, strict=True):
        assert table.shard.placement == "file"
        assert torch.equal(table.lookup(ids, output=torch.bfloat16), written[f"{name}.weight"][ids])
    unbounded = TableOpener(config(file_backed=True), checkpoint=checkpoint)
    assert unbounded.budget is None and all(t.budget is None for t in file_tables(unbounded))


@pytest.mark.parametrize(("among", "split"), [(None, 3), (5, 5)])
def test_a_ram_tiers_budget_is_split_over_the_tables(checkpoint: Path, among: int | None, split: int) -> None:
    budget = 6 * DIM * 2 * 40  # room for 240 rows in all, before the tier's own bookkeeping
    opener = TableOpener(config(file_backed=True, ram_cache_bytes=budget), checkpoint=checkpoint)
    tables = file_tables(opener)
    opener.give_tiers(tables, among=among)
    expected = capacity_alone(checkpoint, budget // split)
    for table in tables:
        assert table.tier is not None and table.tier.name == "ram"
        assert table.tier.capacity == expected


def test_a_profiles_count_of_tables_splits_the_budget_an_engine_gives_one_at_a_time(
    checkpoint: Path, tmp_path: Path, memory_short: None
) -> None:
    hot = {f"{n}.hot_rows": torch.tensor([i, 7], dtype=torch.int64) for i, n in enumerate(NAMES[:2])}
    save_file(hot, tmp_path / "profile.safetensors")
    budget = 6 * DIM * 2 * 40
    settings = config(
        file_backed=True, ram_cache_bytes=budget, device_cache_profile=str(tmp_path / "profile.safetensors")
    )
    opener = TableOpener(settings, checkpoint=checkpoint)
    table = file_tables(opener)[0]
    opener.give_tiers([table], among=7)  # the engine's count: 7; the profile names 2
    assert table.tier is not None and table.tier.capacity == capacity_alone(checkpoint, budget // 2)
    assert table.tier.stats().rows == 2  # warm from the profile: rows 0 and 7
    rows = table.lookup(torch.tensor([0, 7]), output=torch.bfloat16)
    assert table.tier.stats().hits == 2
    assert torch.equal(rows, load_file(checkpoint / "model.safetensors")[f"{NAMES[0]}.weight"][[0, 7]])


def test_no_tier_without_a_budget(checkpoint: Path) -> None:
    opener = TableOpener(config(file_backed=True), checkpoint=checkpoint)
    tables = file_tables(opener)
    opener.give_tiers(tables)
    assert all(t.tier is None for t in tables)


def test_a_plugins_tables_are_opened_with_the_openers_decisions(checkpoint: Path) -> None:
    settings = config(file_backed=True, file_cache_bytes=1 << 20, ram_cache_bytes=1 << 16)
    try:
        first, second = (
            model_tables.open_model_table(
                settings, str(checkpoint), f"model.{n}", FORMAT, "file", row_start=0, table_rows=ROWS, find=True
            )
            for n in NAMES[:2]
        )
        opener = model_tables.opener(settings, str(checkpoint))
        assert first.budget is opener.budget and second.budget is opener.budget
        assert opener.checkpoint is model_tables.checkpoint(str(checkpoint))  # opened once per directory
        assert (first.name, second.name) == NAMES[:2]
        model_tables.give_tier(settings, "model.layers.1.ple", first, 4)
        assert first.tier is not None and first.tier.capacity == capacity_alone(checkpoint, (1 << 16) // 4)
    finally:
        model_tables.forget_checkpoints()


# What the config means for a table is decided in table_opener alone: these names make those decisions.
DECIDERS = {
    "placement_for", "keep_hot", "configured_profile", "ResidentBudget", "open_table", "open_shard",
    "open_tables", "library_runtime", "uva_runtime", "allocate",
}  # fmt: skip
ALLOWED = {"configured_profile"}  # a plugin reads the profile early, to refuse a bad one before loading


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engram"):
            names |= {alias.name for alias in node.names}
    return names


def test_no_user_of_the_table_layer_decides_what_the_config_means_for_a_table() -> None:
    users = [ENGRAM / "runtime" / "engine.py", *sorted((ENGRAM / "integrations").rglob("*.py"))]
    deciding = {
        str(p.relative_to(ENGRAM)): sorted(imported_names(p) & DECIDERS - ALLOWED)
        for p in users
        if imported_names(p) & DECIDERS - ALLOWED
    }
    assert deciding == {}
    assert "TableOpener" in imported_names(ENGRAM / "runtime" / "engine.py")
    assert "TableOpener" in imported_names(ENGRAM / "integrations" / "model_tables.py")
