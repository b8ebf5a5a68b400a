"""File-backed tables whose checkpoint splits them into `shard_<k>` parts (Qwen4Exp's real layout, every
format vLLM loads that way): served from the parts' own pages as one table, a rank's row range spanning
many parts across several files in no particular order, with the RAM tier over it. Every row is checked
against safetensors' own reader of the parts, put back together here, and each format's dequantisation
from its definition (tests/runtime/reference.py)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engram.ngram.spec import ModelSpec
from engram.ops import DEAD_ID
from engram.ops.formats import FORMATS
from engram.ops.segments import Segmented
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.direct_reads import direct_file, read_direct
from engram.runtime.placement.file_reads import stored_part_rows
from engram.runtime.placement.filemap import file_shard, in_memory_fs
from engram.runtime.shard import ShardFormat
from engram.runtime.table import PACKED, Table
from tests.bits import same_bits
from tests.runtime.reference import dequantise, pick
from tests.runtime.specs import DS7, QWEN

PARTS = 300


def scatter_parts(checkpoint: Path, files: int, seed: int) -> dict[str, torch.Tensor]:
    """Move the checkpoint's tensors into `files` safetensors files, each tensor to a random one (so a
    table's parts lie in every file, in no order), through safetensors' own reader and writer; returns
    every tensor as that reader gave it."""
    [path] = sorted(checkpoint.glob("*.safetensors"))
    tensors = load_file(str(path))
    path.unlink()
    chooser = random.Random(seed)
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(files)]
    for name, tensor in tensors.items():
        groups[chooser.randrange(files)][name] = tensor
    for index, group in enumerate(groups):
        save_file(group, str(checkpoint / f"model-{index:05d}-of-{files:05d}.safetensors"))
    return tensors


def whole(tensors: dict[str, torch.Tensor], table: str, suffix: str) -> torch.Tensor:
    """A table's part put back together from its `shard_<k>` pieces, in part order."""
    pieces = {int(n.split(".shard_")[1].split(".")[0]): t for n, t in tensors.items() if n.startswith(f"{table}.shard_") and n.endswith(f".{suffix}")}  # fmt: skip
    return torch.cat([pieces[k] for k in range(len(pieces))])


def joined(tensors: dict[str, torch.Tensor], table: str, dtype: str) -> dict[str, torch.Tensor]:
    """The tensors reference.dequantise reads, for one table whose parts are put back together."""
    f = FORMATS[dtype]
    out = {f"{table}.weight": whole(tensors, table, "weight")}
    if f.scale is not None:
        out[f"{table}.{f.scale_name}"] = whole(tensors, table, f.scale_name)
    if f.table_scale:
        out[f"{table}.{f.table_scale_name}"] = tensors[f"{table}.{f.table_scale_name}"]
    return out


def bf16_on_disk(tmp_path: Path, seed: int, files: int) -> tuple[ModelSpec, str, int, torch.Tensor]:
    """A bf16 Qwen checkpoint on disk with its tables in PARTS parts over `files` files: the spec, the first
    table's name and rows, and its rows as safetensors reads them (skipped on tmpfs: nothing to read past)."""
    spec = dataclasses.replace(QWEN, dtype="bf16")
    write_checkpoint(spec, tmp_path, seed=seed, split_parts=PARTS)
    tensors = scatter_parts(tmp_path, files, seed=seed + 1)
    if in_memory_fs(str(tmp_path)):
        pytest.skip("the temporary directory is on tmpfs: no disk to read a table's rows from")
    table, rows = spec.table_names()[0], spec.layout.table_rows[0]
    return spec, table, rows, joined(tensors, table, "bf16")[f"{table}.weight"]


CASES = [(QWEN, "bf16"), (QWEN, "fp8-table"), (QWEN, "nvfp4"), (DS7, "fp8")]


@pytest.mark.parametrize(("spec", "dtype"), CASES, ids=[d for _, d in CASES])
def test_split_tables_serve_the_parts_rows(spec: ModelSpec, dtype: str, tmp_path: Path) -> None:
    """Row ranges over hundreds of parts in three files: the whole table, one starting and ending inside
    parts, one inside a single part, one of no rows. The shard's stored bytes equal the parts' (read back
    by safetensors), and lookups return them dequantised as the format's definition says, bit for bit,
    zeros for DEAD_ID and rows outside the range, packed bytes as stored."""
    spec = dataclasses.replace(spec, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=7, split_parts=PARTS)
    tensors = scatter_parts(tmp_path, 3, seed=1)
    table, rows = spec.table_names()[0], spec.layout.table_rows[0]
    reference = joined(tensors, table, dtype)
    size = -(-rows // PARTS)
    checkpoint = Checkpoint(tmp_path)
    f = FORMATS[dtype]
    for start, stop in [(0, rows), (size + 3, rows - size - 5), (2 * size + 1, 3 * size - 1), (5, 5)]:
        fmt = ShardFormat(stop - start, spec.head_dim, dtype)
        shard = file_shard(table, fmt, start, rows, checkpoint, None)
        spans = -(-stop // size) - start // size if stop > start else 0
        assert isinstance(shard.weight, Segmented) == (spans > 1)
        assert len(shard.files) == (3 if spans > 1 else len(shard.files))
        local = torch.arange(stop - start)
        for suffix, part in [("weight", shard.weight), (f.scale_name, shard.scale)][: 2 if f.scale else 1]:
            got = stored_part_rows(shard, part, local + start)
            assert torch.equal(got.view(torch.uint8), reference[f"{table}.{suffix}"][start:stop].view(torch.uint8))
        table_view = Table(shard, rows)
        ids = torch.randint(0, rows, (400, 3), generator=torch.Generator().manual_seed(start))
        ids[0] = torch.tensor([DEAD_ID, start, max(start, stop - 1)])
        owned = ((ids >= start) & (ids < stop))[..., None]
        full = pick(dequantise(reference, table, dtype, torch.bfloat16), ids)
        want = torch.where(owned, full, torch.zeros((), dtype=full.dtype))
        assert same_bits(table_view.lookup(ids, output=torch.bfloat16), want)
        packed = table_view.lookup(ids, output=PACKED)
        stored = torch.cat(
            [
                reference[f"{table}.{s}"].view(torch.uint8)
                for s in ("weight", f.scale_name)
                if f"{table}.{s}" in reference
            ],
            dim=1,
        )
        want_packed = torch.where(owned, stored[ids.clamp(min=0)], torch.zeros((), dtype=torch.uint8))
        assert torch.equal(packed, want_packed)


def test_a_ram_tier_over_a_split_table_returns_the_parts_rows(tmp_path: Path, memory_short: None) -> None:
    """A RAM tier over a split table on disk, memory short: its misses read from the parts (past the page
    cache where the file system takes O_DIRECT, through it elsewhere), its hits from RAM, every lookup
    equal to the parts' rows, and the tier holding rows after the first lookups."""
    spec, table, rows, reference = bf16_on_disk(tmp_path, seed=3, files=2)
    start, stop = 11, rows - 13
    shard = file_shard(table, ShardFormat(stop - start, spec.head_dim, "bf16"), start, rows, Checkpoint(tmp_path), None)
    assert isinstance(shard.weight, Segmented) and shard.readahead
    served = Table(shard, rows)
    assert served.keep_hot(64 * shard.format.row_bytes + (1 << 16), "cpu", "ram") > 0
    generator = torch.Generator().manual_seed(5)
    for step in range(6):
        ids = torch.randint(start - 5, stop + 5, (50, 4), generator=generator) % rows
        ids[0, 0] = DEAD_ID
        got = served.lookup(ids, output=torch.bfloat16)
        owned = ((ids >= start) & (ids < stop))[..., None]
        want = torch.where(owned, pick(reference, ids), torch.zeros((), dtype=torch.bfloat16))
        assert same_bits(got, want), step
    stats = served.stats().tier
    assert stats is not None and stats.rows > 0 and stats.hits > 0


def test_direct_reads_of_split_rows_land_in_their_slots(tmp_path: Path) -> None:
    """engram_read_direct_cpu over pieces of several files: each row's bytes, read past the page cache,
    land in its slot alone and equal safetensors' own reader's."""
    spec, table, rows, reference = bf16_on_disk(tmp_path, seed=9, files=3)
    shard = file_shard(table, ShardFormat(rows - 4, spec.head_dim, "bf16"), 4, rows, Checkpoint(tmp_path), None)
    if not direct_file(shard, shard.weight):
        pytest.skip("this file system refuses O_DIRECT (or ENGRAM_DIRECT_READS=0)")
    wanted = torch.tensor(sorted(random.Random(3).sample(range(4, rows), 200)))
    slots = torch.randperm(200, generator=torch.Generator().manual_seed(1))
    into = torch.zeros((200, shard.weight.shape[1]), dtype=shard.weight.dtype)
    asked = read_direct(shard, shard.weight, wanted, slots, into)
    assert asked.ranges >= 1
    assert torch.equal(into[slots].view(torch.int16), reference[wanted].view(torch.int16))
