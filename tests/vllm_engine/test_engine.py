"""Tokens through vLLM's engine: the real LLM.generate of vLLM's CPU build (tests/vllm_engine/runner.py) on
a tiny random Qwen4Exp model (transformers' own implementation made it: PLE tables on two of its layers),
with and without engram. With engram enabled for any placement or tier the CPU can run (engram's device
table, host tables, huge pages, file-backed tables whole or split into shard_<k> parts, the RAM tier over
them, a node copy, the device tier, a page-cache bound), the greedy tokens and every step's raw logits
equal vLLM's own, bit for bit; and vLLM's OpenAI server serves engram's counters at /metrics."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.vllm_engine.runner import ENGINE_PYTHON, EngineFailed, ask_engine, engine_env, needs_engine

pytestmark = needs_engine
VOCAB = 512
CONFIG = {  # the smallest Qwen4Exp vLLM's CPU kernels take: the GDN kernel wants heads of 128
    "vocab_size": VOCAB, "hidden_size": 128, "num_hidden_layers": 3, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 64, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 1, "linear_num_value_heads": 1, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
    # QSA (indexed_attention) needs FlashAttention, a GPU's: every layer is linear attention here
    "layer_types": ["linear_attention"] * 3, "hc_count": 2, "hc_lowrank": 16, "ple_layer_ids": [1, 2],
    "ple_embed_dim": 64, "ngram_vocab_size_base": 500, "heads_per_ngram": 2, "ngram_size": 3,
    "make_ngram_vocab_size_divisible_by": 16, "eos_token_id": 7, "pad_token_id": 0, "bos_token_id": 1,
    "max_position_embeddings": 256, "output_gate_type": "silu",
}  # fmt: skip
PROMPTS = [[11, 12, 13, 14, 15, 7, 16, 17], [300, 301, 11, 12, 13], [42]]
PARTS = 37


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The model with its PLE tables whole, and the same model with them in shard_<k> parts."""
    made = {}
    for name in ("whole", "split"):
        path = tmp_path_factory.mktemp(name)
        case = {"kind": "make_model", "path": str(path), "config": {**CONFIG, "split_ngram_parts": PARTS}}
        answer = ask_engine({**case, "whole": name == "whole"})
        assert list(answer["tables"].values()) == [PARTS, PARTS]  # transformers writes them in parts
        made[name] = path
    return made


def generate(model: Path, engram_config: dict[str, Any], section: dict[str, Any] | None) -> list[dict[str, Any]]:
    case = {
        "kind": "generate", "path": str(model), "engram_config": engram_config, "prompts": PROMPTS,
        "max_tokens": 6, "vocab": VOCAB, "additional_config": {} if section is None else {"engram": section},
    }  # fmt: skip
    return ask_engine(case)["outputs"]  # type: ignore[no-any-return]


# (model, vLLM's --engram-config, engram's section): every placement and tier engram offers on a CPU
ENGRAM = {
    "device table": ("whole", {"cpu_offload": False}, {}),
    "host table": ("whole", {"cpu_offload": True}, {}),
    "huge pages": ("whole", {"cpu_offload": True, "use_thp": True}, {}),
    "node copy": ("whole", {"cpu_offload": True}, {"node_sharing": "node"}),
    "device tier": ("whole", {"cpu_offload": True}, {"device_cache_bytes": 1 << 16}),
    "file-backed": ("whole", {"cpu_offload": True}, {"file_backed": True}),
    "file-backed parts": ("split", {"cpu_offload": True}, {"file_backed": True}),
    "file-backed parts, RAM tier": ("split", {"cpu_offload": True}, {"file_backed": True, "ram_cache_bytes": 1 << 16}),
    "file-backed, page-cache bound": ("whole", {"cpu_offload": True}, {"file_backed": True, "file_cache_bytes": 1 << 16}),
}  # fmt: skip


def test_engram_serves_vllms_tokens_and_logits(models: dict[str, Path]) -> None:
    """vLLM's own table class (cpu_offload false: its device tensor, the one it runs on a CPU) against
    engram's, per model; each run a fresh engine process."""
    theirs = {name: generate(path, {"cpu_offload": False}, None) for name, path in models.items()}
    assert theirs["whole"] == theirs["split"]  # vLLM's loader puts the parts back together
    for outputs in theirs["whole"]:
        assert len(outputs["tokens"]) == 6 and len(outputs["logits"]) == 6
        assert all(len(step) == VOCAB for step in outputs["logits"])
    failures = []
    for name, (model, engram_config, section) in ENGRAM.items():
        try:
            ours = generate(models[model], engram_config, section)
        except EngineFailed as exc:
            failures.append(f"{name}: {exc}")
            continue
        if ours != theirs[model]:
            failures.append(f"{name}: other tokens or logits")
    assert failures == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_vllms_server_serves_engrams_counters(models: dict[str, Path], tmp_path: Path) -> None:
    """`vllm serve` (its OpenAI server) with engram's RAM tier over the file-backed parts: a completion of
    enough tokens for each table to publish its counters (PUBLISH_EVERY lookups), then /metrics holds every
    promised vllm:engram_* series for both PLE tables, labelled tier="ram"."""
    from engram.integrations.vllm.metrics import COUNTERS, PUBLISH_EVERY

    assert ENGINE_PYTHON is not None
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = free_port()
    section = {"engram": {"file_backed": True, "ram_cache_bytes": 1 << 16}}
    command = [
        ENGINE_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(models["split"]), "--port",
        str(port), "--skip-tokenizer-init", "--dtype", "bfloat16", "--max-model-len", "256", "--enforce-eager",
        "--engram-config", json.dumps({"cpu_offload": True}), "--additional-config", json.dumps(section),
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=engine_env(
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir), ENGRAM_DIRECT_READS="0"
        ),  # memory to spare: told, the tier serves
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-6000:]
            assert time.monotonic() < deadline, "vllm serve did not come up within 600 s"
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(2)
        body = json.dumps(
            {"model": str(models["split"]), "prompt": PROMPTS[0], "max_tokens": PUBLISH_EVERY + 2, "temperature": 0}
        ).encode()
        request = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=900) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
            text = reply.read().decode()
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=60)
        log.close()
    for name in [*COUNTERS, "engram_tier_rows"]:
        wire = f"vllm:{name}_total" if name in COUNTERS else f"vllm:{name}"
        series = [line for line in text.splitlines() if line.startswith(wire + "{")]
        tables = {line.split('table="')[1].split('"')[0] for line in series}
        assert len(tables) == 2, (name, series)
        if name.startswith("engram_tier"):
            assert all('tier="ram"' in line for line in series), series
    hits = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:engram_tier_hits_total{")
    ]
    assert sum(hits) > 0
    assert os.environ.get("PROMETHEUS_MULTIPROC_DIR") != str(metrics_dir)  # only the server's environment
