"""vLLM 0.34's disk offload (EngramConfig.disk_offload: true) with engram's section: served by engram's
file-backed table over the same checkpoint parts (and its RAM tier), the rows bit-equal to vLLM's own
disk-offload path (its constructor, load_weights, process_weights_after_loading, stage_checkpoint_rows and
forward, run here on the CPU), never silently left to vLLM's class; without the section, vLLM's own class."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from engram.runtime.checkpoints.writer import write_checkpoint
from tests.runtime.specs import QWEN
from tests.vllm.runner import ask_vllm, needs_vllm, vllm_version

pytestmark = needs_vllm


@pytest.mark.parametrize("dtype", ["bf16", "fp8-table", "nvfp4"])
def test_disk_offload_is_served_by_engram_with_vllms_rows(dtype: str, tmp_path: Path) -> None:
    if vllm_version() < (0, 34):
        pytest.skip("disk_offload is vLLM 0.34's")
    spec = dataclasses.replace(QWEN, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=4, split_parts=37)
    sections = {"file": {}, "ram": {"ram_cache_bytes": 1 << 20}, "bounded": {"file_cache_bytes": 1 << 20}}
    [answer] = ask_vllm("plugin_disk_offload", [{"path": str(tmp_path), "steps": [40, 3, 1, 17], "sections": sections}])
    assert "error" not in answer["vllm"], answer["vllm"]
    layers = sorted(answer["vllm"])
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
