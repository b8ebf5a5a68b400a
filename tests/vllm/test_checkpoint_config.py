"""The config.json `engram make-checkpoint` writes, read by vLLM 0.33.0's own config registry and layout
code (tests/vllm/runner.py): the class vLLM builds, and every table's rows, bucket sizes and offsets (and
Qwen's multipliers and head width) equal to the layout engram serves the tables with."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.apps.presets import get_preset
from engram.runtime.checkpoints.writer import hf_config
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm
PRESETS = {"demo": "DeepseekV41Config", "qwen4-exp-ple": "Qwen4ExpTextConfig"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_vllm_reads_the_written_config(name: str, tmp_path: Path) -> None:
    import json

    spec = get_preset(name)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(spec, spec.dtype, 0)))
    [theirs] = ask_vllm("checkpoint_config", [{"path": str(tmp_path)}])
    layout = spec.layout
    layers = len(layout.layer_ids)
    assert theirs["class"] == PRESETS[name]
    assert theirs["architectures"] == [spec.architecture]
    assert theirs["table_rows"] == list(layout.table_rows)
    assert theirs["offsets"] == layout.offsets.reshape(layers, -1).tolist()
    if spec.family == "deepseek":
        assert theirs["primes"] == layout.primes.tolist()
    else:
        assert theirs["primes"] == layout.primes.reshape(layers, -1).tolist()
        assert theirs["multipliers"] == layout.multipliers.tolist()
        assert theirs["head_dim"] == spec.head_dim
