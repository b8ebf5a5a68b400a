"""Fixtures for the runtime tests: a small model spec, its checkpoint, a private shm directory."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.storage import ShardFormat, TableShard, allocate

# Two fp8 tables of about 7 MB each: large enough for page-level memory accounting, quick to load.
SMALL = ModelSpec(
    name="small",
    architecture="DeepseekV41ForCausalLM",
    hf_text_config={
        "engram_layer_ids": [1, 3],
        "engram_max_ngram_size": 3,
        "engram_n_heads": 4,
        "engram_head_dim": 128,
        "engram_vocab_size": [6_000, 7_000],
        "engram_compressed_vocab_size": 99_092,
        "engram_pad_token_id": 2,
    },
    dtype="fp8",
    tokenizer="deepseek-v4",
)


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ckpt-small")
    write_checkpoint(SMALL, out, seed=7)
    return out


def checkpoint_digests(path: Path, spec: ModelSpec) -> dict[str, str]:
    checkpoint = Checkpoint(path)
    out = {}
    for name in spec.table_names():
        digest = hashlib.sha256(checkpoint.sources[f"{name}.weight"]().view(torch.uint8).numpy().tobytes())
        if f"{name}.scale" in checkpoint.sources:
            digest.update(checkpoint.sources[f"{name}.scale"]().view(torch.uint8).numpy().tobytes())
        out[name] = digest.hexdigest()
    return out


@pytest.fixture
def shm_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private shm directory (on the same tmpfs-backed /dev/shm when possible)."""
    base = Path("/dev/shm")
    root = base if base.is_dir() and base.stat().st_mode & 0o002 else tmp_path
    directory = Path(tempfile.mkdtemp(prefix="engram-test-", dir=root))  # unique even beside a killed run's
    monkeypatch.setenv("ENGRAM_SHM_DIR", str(directory))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def random_shard(rows: int, dtype: str, seed: int, *, dim: int = 64, row_start: int = 0) -> TableShard:
    """A host shard of random bytes (fp8 NaNs included) with scales in a sane exponent range."""
    shard = allocate("t", ShardFormat(rows, dim, dtype), "host", row_start=row_start)
    generator = torch.Generator().manual_seed(seed)
    raw = shard.weight.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    if shard.scale is not None:
        shard.scale.view(torch.uint8).copy_(
            torch.randint(100, 150, shard.scale.shape, dtype=torch.uint8, generator=generator)
        )
    return shard
