"""vLLM 0.34's disk offload (EngramConfig.disk_offload: true) with engram's section: served by engram's
file-backed table over the same checkpoint parts (and its RAM tier), the rows bit-equal to vLLM's own
disk-offload path (its constructor, load_weights, process_weights_after_loading, stage_checkpoint_rows and
forward, run here on the CPU), never silently left to vLLM's class; without the section, vLLM's own class."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import msgspec
import pytest

from engram.apps.planning import summary
from engram.config import ParallelConfig, load_config
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.plan import plan_deployment
from engram.runtime.shard import ShardFormat
from tests.runtime.specs import QWEN
from tests.vllm.runner import ask_vllm, needs_vllm, vllm_version

pytestmark = needs_vllm


@pytest.mark.parametrize("dtype", ["bf16", "fp8-table", "nvfp4"])
def test_disk_offload_is_served_by_engram_with_vllms_rows(
    dtype: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if vllm_version() < (0, 34):
        pytest.skip("disk_offload is vLLM 0.34's")
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")  # memory to spare here: told, the RAM tier serves (page cache)
    spec = dataclasses.replace(QWEN, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=4, split_parts=37)
    sections = {"file": {}, "ram": {"ram_cache_bytes": 1 << 20}, "bounded": {"file_cache_bytes": 1 << 20}}
    [answer] = ask_vllm("plugin_disk_offload", [{"path": str(tmp_path), "steps": [40, 3, 1, 17], "sections": sections}])
    assert "error" not in answer["vllm"], answer["vllm"]
    layers = sorted(k for k in answer["vllm"] if k != "calls")
    assert len(layers) == len(spec.table_names())
    for layer in layers:
        theirs = answer["vllm"][layer]
        assert theirs["class"] == "Qwen4ExpPLEDiskOffloadEmbedding" and theirs["stats"] is None
        assert answer["disabled"][layer] == {**theirs, "class": "EngramQwenDiskOffloadEmbedding"}
        for name in sections:
            ours = answer[name]
            assert "error" not in ours, ours
            assert ours[layer]["class"] == "EngramQwenDiskOffloadEmbedding"
            assert ours[layer]["rows"] == theirs["rows"], (name, layer)
            stats = ours[layer]["stats"]
            assert stats["placement"] == "file" and stats["lookups"] == 4 and stats["row_start"] == 0
        tier = answer["ram"][layer]["stats"]["tier"]
        assert tier is not None and tier["tier"] == "ram" and tier["rows"] > 0


def test_a_step_starts_every_layers_reads_before_its_first_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's stage_checkpoint_rows stages every PLE layer of a step after one stream sync: with engram,
    the step's first stage_rows starts the reads of every layer's rows (Table.prefetch, into its RAM tier
    or the page cache), then each layer's lookup follows; the rows equal vLLM's own, step after step."""
    if vllm_version() < (0, 34):
        pytest.skip("disk_offload is vLLM 0.34's")
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")  # memory to spare here: told, the RAM tier serves (page cache)
    write_checkpoint(QWEN, tmp_path, seed=5, split_parts=37)
    sections = {"file": {}, "ram": {"ram_cache_bytes": 1 << 20}}
    steps = [40, 3, 1, 17]
    [answer] = ask_vllm(
        "plugin_disk_offload", [{"path": str(tmp_path), "steps": steps, "sections": sections, "together": True}]
    )
    assert "error" not in answer["vllm"], answer["vllm"]
    assert answer["vllm"]["calls"] == []
    layers = sorted(k for k in answer["vllm"] if k != "calls")
    assert len(layers) == len(QWEN.table_names()) > 1
    for name in sections:
        ours = answer[name]
        assert "error" not in ours, ours
        for layer in layers:
            assert ours[layer]["rows"] == answer["vllm"][layer]["rows"], (name, layer)
        tables = [call.split(" ", 1)[1] for call in ours["calls"][: len(layers)]]
        step = [f"prefetch {t}" for t in tables] + [f"lookup {t}" for t in tables]
        assert ours["calls"] == step * len(steps), name
        assert len(set(tables)) == len(layers)
    tier = answer["ram"][layers[-1]]["stats"]["tier"]
    assert tier is not None and tier["rows"] > 0


def test_every_etp_rank_reads_full_rows_as_the_plan_says(tmp_path: Path) -> None:
    """vLLM 0.34's own disk offload at ETP 2: each rank's rows are the whole table's (its all-reduce made the
    identity here, so a rank holding half the rows would show zeros), which is engram plan's disk-offload
    layout: whole tables at every rank, no collective, every token's full rows staged."""
    if vllm_version() < (0, 34):
        pytest.skip("disk_offload is vLLM 0.34's")
    write_checkpoint(QWEN, tmp_path, seed=6, split_parts=37)
    shapes = [(1, 0), (2, 0), (2, 1)]
    cases = [{"path": str(tmp_path), "steps": [17, 3], "sections": {}, "etp": e, "etp_rank": r} for e, r in shapes]
    answers = ask_vllm("plugin_disk_offload", cases)
    whole = answers[0]["vllm"]
    assert "error" not in whole, whole
    layers = sorted(k for k in whole if k != "calls")
    for answer in answers[1:]:
        assert [answer["vllm"][layer]["rows"] for layer in layers] == [whole[layer]["rows"] for layer in layers]
    config = load_config({"disk_offload": True}, env={})
    for tp, dp, across in ((2, 1, False), (2, 2, True), (4, 2, False)):
        parallel = ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)
        plan = plan_deployment(QWEN, msgspec.structs.replace(config, embedding_across_dp=across), parallel, "cuda")
        assert len(plan.ranks) == tp * dp
        assert all(t.row_start == 0 and t.rows == t.table_rows for r in plan.ranks for t in r.tables)
        assert {t.table for t in plan.ranks[0].tables} == set(QWEN.table_names())
        report = summary(plan)
        assert report["collectives"] == [] and report["placement"] == "file"
        layout = QWEN.layout
        row_bytes = ShardFormat(1, QWEN.head_dim, QWEN.dtype).row_bytes
        assert report["staged_bytes_per_token"] == len(layout.layer_ids) * layout.columns * row_bytes
