"""Shards and checkpoint digests the runtime tests make: a host shard of random bytes, and a digest of
each table of a checkpoint as safetensors reads it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.storage import allocate
from engram.runtime.shard import ShardFormat, TableShard


def checkpoint_digests(path: Path, spec: ModelSpec) -> dict[str, str]:
    checkpoint = Checkpoint(path)
    out = {}
    for name in spec.table_names():
        digest = hashlib.sha256(checkpoint.sources[f"{name}.weight"]().view(torch.uint8).numpy().tobytes())
        if f"{name}.scale" in checkpoint.sources:
            digest.update(checkpoint.sources[f"{name}.scale"]().view(torch.uint8).numpy().tobytes())
        out[name] = digest.hexdigest()
    return out


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
