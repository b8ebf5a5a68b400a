"""engram's DeepSeek V4.1 Engram table inside SGLang 0.5.23 (engram.integrations.sglang), against SGLang's
own EngramEmbedding on the same checkpoint and ids (tests/sglang/sglang_side.py runs both in SGLang's
venv): each TP rank's rows (SGLang's shard_range: whole hash columns where they divide) bit-equal for every
placement engram offers inside SGLang and with its tiers, the weights given through each class's own
loaders; and both equal a scalar dequantisation of safetensors' own reading of the file. With TP 1 the
forward's rows are equal too, and the ranks' rows add up to them (what SGLang's all-reduce makes)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engram.apps.presets import get_preset
from engram.config import ParallelConfig, load_config
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.plan import plan_deployment
from tests.sglang.runner import ask_sglang, needs_sglang

TINY = get_preset("tiny")
LAYER = 1  # the second Engram layer: its ids are not the first table's
CONFIGS = {
    "host": {"cpu_offload": True},
    "huge pages": {"cpu_offload": True, "use_thp": True},
    "file": {"cpu_offload": True, "file_backed": True},
    "file, RAM tier": {"cpu_offload": True, "file_backed": True, "ram_cache_bytes": 1 << 20},
    "node copy": {"cpu_offload": True, "node_sharing": "node"},
    "host, device tier": {"cpu_offload": True, "device_cache_bytes": 16 << 20},
}
PLACEMENTS = {
    "host": "host", "huge pages": "hugepages", "file": "file", "file, RAM tier": "file", "node copy": "node",
    "host, device tier": "host",
}  # fmt: skip


def bounds() -> list[int]:
    primes = TINY.layout.primes.reshape(len(TINY.layout.layer_ids), -1)[LAYER]
    return [0, *torch.tensor(primes.astype("int64")).cumsum(0).tolist()]


def id_batches() -> list[list[list[int]]]:
    """A decode-sized and a prefill-sized batch of [T, columns] ids, and one of every edge: row 0, each
    column bound and the row before it, the last row."""
    rows, columns = TINY.layout.table_rows[LAYER], len(bounds()) - 1
    generator = torch.Generator().manual_seed(11)
    edges = sorted({0, rows - 1, *[b for b in bounds()[1:-1]], *[b - 1 for b in bounds()[1:]]})
    edge_ids = torch.tensor(edges + [0] * (-len(edges) % columns)).view(-1, columns)
    return [
        torch.randint(0, rows, (8, columns), generator=generator).tolist(),
        torch.randint(0, rows, (2048, columns), generator=generator).tolist(),
        edge_ids.tolist(),
    ]


def reference_rows(checkpoint: Path, ids: list[list[int]], row_start: int, row_stop: int) -> str:
    """The digest of the rows a rank owns, zeros for the rest, dequantised as the spec says (fp32 of the
    fp8 value times 2^(e - 127) of its block of 32, rounded once to bf16), from safetensors' own reader."""
    layer_id = TINY.layout.layer_ids[LAYER]
    tensors = load_file(checkpoint / "model.safetensors")
    weight = tensors[f"layers.{layer_id}.engram.embed.weight"].float()
    scale = tensors[f"layers.{layer_id}.engram.embed.scale"].view(torch.uint8).to(torch.int32)
    table = (weight.view(weight.shape[0], -1, 32) * torch.exp2((scale - 127).float()).unsqueeze(-1)).view_as(weight)
    index = torch.tensor(ids)
    owned = (index >= row_start) & (index < row_stop)
    rows = table[index].to(torch.bfloat16).masked_fill(~owned.unsqueeze(-1), 0)  # +0.0, not a product's -0.0
    return hashlib.sha256(rows.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    whole, split = tmp_path_factory.mktemp("whole"), tmp_path_factory.mktemp("split")
    write_checkpoint(TINY, whole / "ckpt")
    write_checkpoint(TINY, split / "ckpt", split_parts=7)
    return {"whole": whole / "ckpt", "split": split / "ckpt"}


@needs_sglang
def test_every_placement_serves_sglangs_rows_at_every_tp_rank(checkpoints: dict[str, Path]) -> None:
    ids = id_batches()
    cases: list[dict[str, Any]] = [
        {"preset": "tiny", "layer": LAYER, "checkpoint": str(checkpoints["whole"]), "config": config,
         "tp": [1, 2, 4], "ids": ids, "repeat": 2}
        for config in CONFIGS.values()
    ]  # fmt: skip
    cases.append({**cases[CONFIGS_ORDER.index("file")], "checkpoint": str(checkpoints["split"])})
    answers = ask_sglang("rows", cases)
    for (label, _), answer in zip([*CONFIGS.items(), ("file, split parts", None)], answers, strict=True):
        assert [(r["tp"], r["rank"]) for r in answer["ranks"]] == [(1, 0), (2, 0), (2, 1), *[(4, k) for k in range(4)]]
        for rank in answer["ranks"]:
            assert rank["placement"] == PLACEMENTS.get(label, "file"), label
            assert rank["tier"] == {"file, RAM tier": "ram", "host, device tier": "device"}.get(label), label
            assert rank["staged_by_scheduler"] is False, label  # EngramRowStager.from_model leaves it to forward
            for batch, asked in zip(rank["batches"], ids, strict=True):
                assert batch["equal"], (label, rank["tp"], rank["rank"])
                reference = reference_rows(
                    checkpoints["whole"], asked, rank["row_start"], rank["row_start"] + rank["rows"]
                )
                assert batch["sglang"] == batch["engram"] == reference, (label, rank["tp"], rank["rank"])
                assert batch.get("forward_equal", True), label
        for tp in (2, 4):  # the ranks' rows own every row once: SGLang's all-reduce adds them up to TP 1's
            shown = [r for r in answer["ranks"] if r["tp"] == tp]
            assert sorted((r["row_start"], r["row_start"] + r["rows"]) for r in shown)[0][0] == 0
            assert sum(r["rows"] for r in shown) == TINY.layout.table_rows[LAYER]
        planned = {  # `engram plan --engine sglang` says the same rows of every rank
            (tp, rank.tp_rank): (rank.tables[LAYER].row_start, rank.tables[LAYER].rows)
            for tp in (1, 2, 4)
            for rank in plan_deployment(TINY, load_config(cases[0]["config"], env={}), ParallelConfig(tensor_parallel_size=tp), "cpu", "sglang").ranks
        }  # fmt: skip
        assert planned == {(r["tp"], r["rank"]): (r["row_start"], r["rows"]) for r in answer["ranks"]}


CONFIGS_ORDER = list(CONFIGS)


@needs_sglang
def test_sglangs_plugin_loader_puts_engrams_class_everywhere_sglang_holds_the_name() -> None:
    [answer] = ask_sglang("plugin", [{}], env={"SGLANG_PLUGINS": "engram"})
    assert answer["mro"] == ["engram.integrations.sglang.deepseek", "sglang.srt.layers.engram"]
    replaced = answer["replaced"]
    assert replaced["sglang.srt.layers.engram"] == "engram.integrations.sglang.deepseek"
    assert replaced["sglang.srt.models.qwen4_exp"] == "engram.integrations.sglang.qwen"
    assert all(module in (None, "engram.integrations.sglang.deepseek") for module in list(replaced.values())[:3])
    assert answer["naming_hooked"]


@needs_sglang
def test_a_mistake_in_the_section_or_beside_it_is_one_line_naming_it(checkpoints: dict[str, Path]) -> None:
    cases = [
        {"env": {"ENGRAM_SGLANG_CONFIG": '{"cpu_offload": true, "cpu_offlaod": true}'}},
        {"env": {"ENGRAM_SGLANG_CONFIG": '{"cpu_offload": true}', "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "1"}},
        {"env": {"ENGRAM_SGLANG_CONFIG": '{"cpu_offload": true, "dp_shared_memory": true}'}},
        {"env": {"ENGRAM_SGLANG_CONFIG": '{"cpu_offload": true, "file_backed": true}'}, "checkpoint": "/nonexistent"},
        {"env": {"ENGRAM_SGLANG_CONFIG": "[1, 2"}},
        {"env": {"ENGRAM_SGLANG_CONFIG": ""}},  # not enabled: SGLang's own class, which builds
    ]
    answers = ask_sglang("error", cases)
    errors = [a["error"] for a in answers]
    assert errors[0].startswith("ConfigError: /engram/cpu_offlaod: unknown field 'cpu_offlaod'")
    assert errors[1] == (
        "EngramError: SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1 asks SGLang to keep DeepSeek V4.1's tables itself, "
        "and ENGRAM_SGLANG_CONFIG asks engram to: unset SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE, or ENGRAM_SGLANG_CONFIG"
    )
    assert errors[2].startswith("EngramError: engram setting 'dp_shared_memory' cannot be honoured inside SGLang: ")
    assert errors[3] == (
        "EngramError: engram setting 'file_backed' reads tables from the model's checkpoint files on local disk; "
        "'/nonexistent' is not a directory (download the model first)"
    )
    assert errors[4].startswith("ConfigError: ") and "ENGRAM_SGLANG_CONFIG" in errors[4]
    assert errors[5] is None
    assert all("\n" not in e for e in errors if e)
