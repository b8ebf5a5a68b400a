"""The plugin's tables (engram.integrations.vllm.tables) without vLLM: a module's file-backed table is the
checkpoint's tensor found by vLLM's prefix, with rows equal to safetensors' own reader; every table of a
checkpoint shares one page-cache budget per bound; a served table gets its tier on its first lookup, warm
from the profile's table named as the checkpoint names it; and each lookup reaches the metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from engram.config import EngramConfig, load_config
from engram.errors import EngramError
from engram.integrations import model_tables
from engram.integrations.vllm import tables
from engram.integrations.vllm.metrics import METRICS
from engram.runtime.table import ShardFormat, Table
from tests.integrations.test_vllm_metrics import recording

ROWS, DIM = 512, 16
CHECKPOINT_NAME = "model.language_model.layers.3.ple"  # as the checkpoint names it
VLLM_PREFIX = "model.layers.3.ple"  # as vLLM's module prefix has it


@pytest.fixture
def model(tmp_path: Path) -> Iterator[SimpleNamespace]:
    """A checkpoint directory holding two bf16 tables, as vLLM's config points at it."""
    generator = torch.Generator().manual_seed(7)
    weights = {
        f"{CHECKPOINT_NAME}.weight": torch.randn(ROWS, DIM, generator=generator).to(torch.bfloat16),
        "model.language_model.layers.5.ple.weight": torch.randn(ROWS, DIM, generator=generator).to(torch.bfloat16),
    }
    save_file(weights, tmp_path / "model.safetensors")
    yield SimpleNamespace(model_config=SimpleNamespace(model=str(tmp_path)), load_config=SimpleNamespace())
    model_tables.forget_checkpoints()
    model_tables.profile.cache_clear()


def config(**fields: object) -> EngramConfig:
    return load_config({"cpu_offload": True, "file_backed": True, **fields}, env={})


def open_file_table(vllm_config: SimpleNamespace, prefix: str = VLLM_PREFIX, **fields: object) -> Table:
    return tables.open_for(
        config(**fields), vllm_config, prefix, ShardFormat(ROWS, DIM, "bf16"), "file",
        row_start=0, table_rows=ROWS, find=True,
    )  # fmt: skip


def test_a_file_backed_table_is_the_checkpoints_tensor_found_by_vllms_prefix(model: SimpleNamespace) -> None:
    table = open_file_table(model)
    assert table.name == CHECKPOINT_NAME
    ids = torch.tensor([[0, 511], [17, 3]])
    expected = load_file(Path(model.model_config.model) / "model.safetensors")[f"{CHECKPOINT_NAME}.weight"]
    assert torch.equal(table.lookup(ids, output=torch.bfloat16), expected[ids])


def test_a_prefix_the_checkpoint_lacks_is_refused_naming_what_it_holds(model: SimpleNamespace) -> None:
    with pytest.raises(EngramError) as caught:
        open_file_table(model, "model.layers.4.ple")
    assert str(caught.value) == (
        "engram: the checkpoint should hold one table ending in layers.4.ple.weight (or in "
        "layers.4.ple.shard_<k>.weight parts) for the engine's model.layers.4.ple, it holds none"
    )


def test_tables_of_one_checkpoint_share_one_budget_per_bound(model: SimpleNamespace) -> None:
    first = open_file_table(model, file_cache_bytes=1 << 20)
    second = open_file_table(model, "model.layers.5.ple", file_cache_bytes=1 << 20)
    other_bound = open_file_table(model, file_cache_bytes=2 << 20)
    unbounded = open_file_table(model)
    assert first.budget is not None and first.budget is second.budget
    assert other_bound.budget is not None and other_bound.budget is not first.budget
    assert unbounded.budget is None


def test_a_served_table_gets_its_tier_on_its_first_lookup_warm_from_the_profile(
    model: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory_short: None
) -> None:
    hot = torch.tensor([9, 4, 100], dtype=torch.int64)
    save_file(
        {f"{CHECKPOINT_NAME}.hot_rows": hot, f"{CHECKPOINT_NAME}.hot_counts": torch.tensor([5, 3, 1])},
        tmp_path / "profile.safetensors",
    )
    metrics, families = recording()
    monkeypatch.setattr(METRICS, "_metrics", metrics._metrics)
    settings = config(device_cache_profile=str(tmp_path / "profile.safetensors"), ram_cache_bytes=1 << 16)
    table = tables.open_for(
        settings, model, VLLM_PREFIX, ShardFormat(ROWS, DIM, "bf16"), "file", row_start=0, table_rows=ROWS, find=True
    )
    served = tables.Served(settings, VLLM_PREFIX, table, 1, tiered=True)
    assert table.tier is None  # nothing before the weights are loaded
    served.lookup(torch.tensor([1, 2]), torch.bfloat16)
    tier = table.tier
    assert tier is not None and tier.name == "ram"
    hits = tier.stats().hits
    rows = served.lookup(hot, torch.bfloat16)  # the profile's rows: held from the start
    assert table.tier is tier  # given once
    assert tier.stats().hits - hits == hot.numel()
    expected = load_file(Path(model.model_config.model) / "model.safetensors")[f"{CHECKPOINT_NAME}.weight"]
    assert torch.equal(rows, expected[hot])
    assert families["engram_lookups"].series[(VLLM_PREFIX, "ram", "0")].total == 2  # published at the first


def test_a_profile_with_two_tables_of_vllms_tail_is_refused(model: SimpleNamespace, tmp_path: Path) -> None:
    ids = torch.tensor([1], dtype=torch.int64)
    save_file(
        {f"{CHECKPOINT_NAME}.hot_rows": ids, f"mtp.{CHECKPOINT_NAME}.hot_rows": ids.clone()},
        tmp_path / "profile.safetensors",
    )
    profile = str(tmp_path / "profile.safetensors")
    settings = config(device_cache_profile=profile, ram_cache_bytes=1 << 16)
    table = open_file_table(model)
    with pytest.raises(EngramError) as caught:
        model_tables.give_tier(settings, VLLM_PREFIX, table, 1)
    assert str(caught.value) == (
        f"the profile {profile} holds 2 tables ending in layers.3.ple ({CHECKPOINT_NAME}, mtp.{CHECKPOINT_NAME}); "
        "profile this model with `engram profile --out`"
    )
