"""The table the resident-set budget tests serve (file_cache_bytes): a 96 MiB bf16 table in a safetensors
file, opened file-backed under a budget as the engine does; also imported by their cgroup child."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.file_reads import watch_files
from engram.runtime.placement.filemap import file_shard
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import ShardFormat

ROWS, DIM, COLUMNS = 98_304, 512, 8  # a 96 MiB bf16 table
BUDGET = 16 << 20
CGROUP = Path("/sys/fs/cgroup/memory")


def table(directory: Path) -> Path:
    weight = torch.randn(ROWS, DIM, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    save_file({"t.weight": weight}, str(directory / "model.safetensors"))
    fd = os.open(directory / "model.safetensors", os.O_RDONLY)
    os.fsync(fd)  # written back: clean pages, which the page cache may drop (a checkpoint's always are)
    os.close(fd)
    return directory


def open_table(directory: Path, budget: int) -> tuple[EngramEmbedding, ResidentBudget | None]:
    shard = file_shard("t", ShardFormat(ROWS, DIM, "bf16"), 0, ROWS, Checkpoint(directory), None)
    limit = None
    if budget:  # as the engine does
        limit = ResidentBudget(budget)
        watch_files(limit, shard)
    plan = TableShardPlan("t", ROWS, "row", 0, ROWS, 0, COLUMNS)
    return EngramEmbedding(shard, plan, columns=COLUMNS, budget=limit), limit
