"""Which tier the config gives a table (tiers.assign.keep_hot, for the engine and the plugin alike): a RAM
tier over a checkpoint on disk, a device tier over memory, and over a checkpoint on tmpfs, which is memory
already, no RAM tier (said once per table) but the device tier."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.config import EngramConfig, load_config
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables
from engram.runtime.table import Table
from engram.runtime.tiers.assign import keep_hot
from engram.runtime.tiers.device import DeviceTier
from engram.runtime.tiers.ram import RamTier
from tests.runtime.specs import SMALL

BUDGET = 1 << 20


def mapped_table(checkpoint: Path) -> Table:
    plans = table_shards(SMALL, 0, 1)
    shard = open_tables(SMALL, Checkpoint(checkpoint), "file", plans=plans, progress=False)[0]
    return Table(shard, plans[0].table_rows)


@pytest.fixture
def tmpfs_checkpoint() -> Iterator[Path]:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm here")
    with tempfile.TemporaryDirectory(prefix="engram-test-", dir="/dev/shm") as directory:
        write_checkpoint(SMALL, Path(directory), seed=7)
        yield Path(directory)


def config(**budgets: int) -> EngramConfig:
    return load_config({"cpu_offload": True, "file_backed": True, **budgets}, env={})


def test_a_checkpoint_on_disk_takes_the_ram_tier(small_checkpoint: Path) -> None:
    table = mapped_table(small_checkpoint)
    assert table.shard.readahead  # the premise: a file on disk
    keep_hot(config(ram_cache_bytes=BUDGET), [table], "cpu")
    assert isinstance(table.tier, RamTier) and table.tier.name == "ram"
    table.release()


def test_a_checkpoint_on_tmpfs_takes_no_ram_tier_but_the_device_tier(
    tmpfs_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    table = mapped_table(tmpfs_checkpoint)
    assert table.shard.files and not table.shard.readahead  # the premise: a file in memory
    with caplog.at_level(logging.WARNING, logger="engram"):
        keep_hot(config(ram_cache_bytes=BUDGET), [table], "cpu")
    assert table.tier is None
    assert [r.getMessage() for r in caplog.records] == [
        f"engram: ram_cache_bytes is not used for {table.name}: its file is on tmpfs or hugetlbfs, in memory "
        "already (device_cache_bytes keeps its hottest rows)"
    ]
    keep_hot(config(device_cache_bytes=8 * BUDGET), [table], "cpu")
    assert isinstance(table.tier, DeviceTier) and table.tier.name == "device"
    table.release()


def test_a_checkpoint_on_disk_given_only_device_cache_bytes_takes_no_tier_on_any_device(
    small_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file on disk's hot rows are a RAM tier's: device_cache_bytes alone gives it none, on the CPU as on
    a GPU, and says which field to set; a table opened without a kind takes the one its misses call for."""
    table = mapped_table(small_checkpoint)
    with caplog.at_level(logging.WARNING, logger="engram"):
        keep_hot(config(device_cache_bytes=8 * BUDGET), [table], "cpu")
    assert table.tier is None
    assert [r.getMessage() for r in caplog.records] == [
        f"engram: device_cache_bytes is not used for {table.name}: its file is on disk, where a miss is a disk "
        "read and its hot rows are kept by a RAM tier: give it ram_cache_bytes (or put the checkpoint on tmpfs)"
    ]
    assert table.keep_hot(BUDGET, "cpu") > 0
    assert isinstance(table.tier, RamTier) and table.tier.name == "ram"
    table.release()
