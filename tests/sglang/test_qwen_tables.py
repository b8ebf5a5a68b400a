"""engram's Qwen4Exp PLE table inside SGLang 0.5.23 (engram.integrations.sglang.qwen), against SGLang's own
Qwen4ExpPinnedHostEmbedding on the same checkpoint and ids (tests/sglang/sglang_side.py runs both in
SGLang's venv, SGLang's Triton gather interpreted): each TP rank's vocabulary shard gathered bit-equal for
every placement engram offers inside SGLang and with its tiers, into the prefetch buffer it is given, the
weight through each class's own loader; and both equal safetensors' own reading of the file, zeros for
the rows other ranks hold."""

from __future__ import annotations

import hashlib
import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engram.config import ParallelConfig, load_config
from engram.integrations.sglang.qwen import _BUILDING, named_by_module
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.plan import plan_deployment
from tests.runtime.specs import QWEN
from tests.sglang.runner import ask_sglang, needs_sglang

TABLE = QWEN.table_names()[0]  # as the checkpoint names it
SGLANG_PREFIX = "model.layers.0.ple.ple_embedding.ngram_embedding"  # as SGLang's module names it
CONFIGS = {
    "host": ({"cpu_offload": True}, "host", None),
    "huge pages": ({"cpu_offload": True, "use_thp": True}, "hugepages", None),
    "file": ({"cpu_offload": True, "file_backed": True}, "file", None),
    "file, RAM tier": ({"cpu_offload": True, "file_backed": True, "ram_cache_bytes": 1 << 20}, "file", "ram"),
    "node copy": ({"cpu_offload": True, "node_sharing": "node"}, "node", None),
    "host, device tier": ({"cpu_offload": True, "device_cache_bytes": 16 << 20}, "host", "device"),
}


def id_batches(rows: int) -> list[list[list[int]]]:
    """A decode-sized and a prefill-sized batch of [T, heads] ids, and one of every shard's edges at TP 2
    and 4 (SGLang's vocabulary shards are padded to 64-row multiples) with row 0 and the last row."""
    generator = torch.Generator().manual_seed(5)
    edges = sorted(
        {0, rows - 1, *[min(rows - 1, max(0, k * 64 * e - d)) for k in range(1, 40) for e in (1,) for d in (0, 1)]}
    )
    edge_ids = torch.tensor(edges + [0] * (-len(edges) % 4)).view(-1, 4)
    return [
        torch.randint(0, rows, (8, 4), generator=generator).tolist(),
        torch.randint(0, rows, (256, 4), generator=generator).tolist(),  # SGLang's gather interpreted: a program an id
        edge_ids.tolist(),
    ]


def reference(checkpoint: Path, ids: list[list[int]], start: int, stop: int) -> str:
    """The digest of the rows of [start, stop) safetensors reads, zeros for the others."""
    table = load_file(checkpoint / "model.safetensors")[f"{TABLE}.weight"]
    index = torch.tensor(ids)
    owned = (index >= start) & (index < stop)
    rows = table[index.clamp(0, table.shape[0] - 1)].masked_fill(~owned.unsqueeze(-1), 0)
    return hashlib.sha256(rows.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen") / "ckpt"
    write_checkpoint(QWEN, path)
    return path


@needs_sglang
def test_every_placement_gathers_sglangs_rows_at_every_tp_rank(checkpoint: Path) -> None:
    rows = QWEN.layout.table_rows[0]
    ids = id_batches(rows)
    case = {
        "checkpoint": str(checkpoint), "table": TABLE, "prefix": SGLANG_PREFIX, "tp": [1, 2, 4], "ids": ids,
        "configs": [config for config, _, _ in CONFIGS.values()],
    }  # fmt: skip
    [answer] = ask_sglang("qwen rows", [case])
    for (label, (_, placement, tier)), shown in zip(CONFIGS.items(), answer["configs"], strict=True):
        assert [(r["tp"], r["rank"]) for r in shown["ranks"]] == [(1, 0), (2, 0), (2, 1), *[(4, k) for k in range(4)]]
        for rank in shown["ranks"]:
            assert rank["placement"] == placement, label
            for batch, asked in zip(rank["batches"], ids, strict=True):
                assert batch["equal"] and batch["into_buffer"] and batch["tier"] == tier, (
                    label,
                    rank["tp"],
                    rank["rank"],
                )
                assert batch["sglang"] == batch["engram"] == reference(checkpoint, asked, rank["start"], rank["stop"])
        for tp in (2, 4):  # every row in one rank's shard
            spans = sorted((r["start"], r["stop"]) for r in shown["ranks"] if r["tp"] == tp)
            assert spans[0][0] == 0 and spans[-1][1] == rows
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
        planned = {  # `engram plan --engine sglang` says the same rows of every rank
            (tp, rank.tp_rank): (rank.tables[0].row_start, rank.tables[0].row_stop)
            for tp in (1, 2, 4)
            for rank in plan_deployment(QWEN, load_config(CONFIGS["host"][0], env={}), ParallelConfig(tensor_parallel_size=tp), "cpu", "sglang").ranks
        }  # fmt: skip
        assert planned == {(r["tp"], r["rank"]): (r["start"], r["stop"]) for r in shown["ranks"]}


def test_a_ple_table_is_named_by_the_module_that_builds_it() -> None:
    """The AROUND hook of SGLang's Qwen4ExpNGramEmbedding.__init__ gives the table its module's prefix,
    however the prefix is passed, and only while that module builds."""
    seen: list[str | None] = []

    def init(
        self: object,
        config: object,
        embedding_dim: int,
        ple_layer_index: int = 0,
        quant_config: object = None,
        prefix: str = "",
    ) -> None:
        seen.append(_BUILDING.get())

    named_by_module(init, object(), None, 64, 0, None, "model.layers.3.ple.ple_embedding")
    named_by_module(init, object(), None, 64, prefix="model.layers.4.ple.ple_embedding")
    named_by_module(init, object(), None, 64)
    assert seen == [
        "model.layers.3.ple.ple_embedding.ngram_embedding",
        "model.layers.4.ple.ple_embedding.ngram_embedding",
        "ngram_embedding",
    ]
    assert _BUILDING.get() is None
