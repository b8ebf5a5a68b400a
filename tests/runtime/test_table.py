"""The table layer (engram.runtime.table) once for every placement x row format x row range: a shard of a
table written with safetensors' own writer, opened by the table layer and filled by engram's checkpoint
loader (mapped, for placement file), returns for global row ids (DEAD_ID, other shards' rows and repeats
among them) exactly what safetensors' own reader and a float64 dequantisation from the formats'
definitions (tests/runtime/reference.py) say: the stored rows, the stored bytes (PACKED), and the rows
dequantised into bfloat16 and float32, fresh and into a kept buffer, with and without a device cache of
hot rows. Placement shm is a collective: its cases run in one spawned rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engram.apps.local_ranks import run_local, values
from engram.errors import EngramError
from engram.ops.formats import FORMATS
from engram.runtime import dist as edist
from engram.runtime.checkpoints.loader import Checkpoint, load_shards
from engram.runtime.placement.filemap import in_memory_fs
from engram.runtime.placement.residency import drop_file_cache
from engram.runtime.shard import Placement
from engram.runtime.table import PACKED, ShardFormat, Table, open_table
from engram.runtime.tiers.budget import state_bytes
from tests.bits import same_bits
from tests.runtime.reference import DEAD_ID, dequantise

TABLE_ROWS, SHARD_ROWS, DIM = 200, 100, 64
ROW_STARTS = (0, 72)
PLACEMENTS: tuple[Placement, ...] = ("device", "pinned", "hugepages", "host", "file")
OUTPUTS = (torch.bfloat16, torch.float32)


def write_table(directory: Path, dtype: str, seed: int) -> Path:
    """Table `t` of TABLE_ROWS rows in `dtype`, random bytes (fp8 NaNs included), scales in a sane range."""
    f, generator = FORMATS[dtype], torch.Generator().manual_seed(seed)

    def raw(shape: tuple[int, ...], dtype: torch.dtype, low: int = 0, high: int = 256) -> torch.Tensor:
        bits = torch.randint(
            low, high, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=torch.uint8, generator=generator
        )
        return bits.view(dtype)

    width = f.weight_width(DIM)
    if f.weight.is_floating_point and f.weight.itemsize > 1:
        tensors = {"t.weight": torch.randn(TABLE_ROWS, width, generator=generator).to(f.weight)}
    else:
        tensors = {"t.weight": raw((TABLE_ROWS, width), f.weight)}
    if f.scale is not None:  # ue8m0 exponents near 2^0, or e4m3 scales that are finite and positive
        low, high = (100, 150) if f.scale == torch.float8_e8m0fnu else (0x20, 0x50)
        tensors[f"t.{f.scale_name}"] = raw((TABLE_ROWS, f.scale_width(DIM)), f.scale, low, high)
    if f.table_scale:
        tensors[f"t.{f.table_scale_name}"] = torch.tensor(0.0375, dtype=torch.float32)
    path = directory / dtype
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tables")
    return {dtype: write_table(root, dtype, seed) for seed, dtype in enumerate(FORMATS)}


def ids_for(row_start: int) -> torch.Tensor:
    """[40, 3] global ids: the shard's rows, its neighbours', the table's first and last, DEAD_ID, repeats."""
    generator = torch.Generator().manual_seed(row_start + 1)
    ids = torch.randint(0, TABLE_ROWS, (40, 3), generator=generator)
    ids[0] = torch.tensor([DEAD_ID, 0, TABLE_ROWS - 1])
    ids[1] = torch.tensor([row_start, row_start + SHARD_ROWS - 1, row_start + SHARD_ROWS])
    ids[2] = ids[1]
    return ids


def lookups(table: Table, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each kind of lookup returns (the stored rows as raw bytes, to compare bits)."""
    out = {"stored": table.lookup(ids, output=table.weight.dtype), "packed": table.lookup(ids, output=PACKED)}
    for dtype in OUTPUTS:
        out[str(dtype)] = table.lookup(ids, output=dtype)
        kept = torch.full((*ids.shape, DIM), 7.0, dtype=dtype)  # poisoned: every element must be written
        assert table.lookup(ids, kept) is kept
        out[f"{dtype} kept"] = kept
    return out


def open_loaded(placement: Placement, dtype: str, row_start: int, path: Path, group: Any = None) -> Table:
    checkpoint = Checkpoint(path)
    fmt = ShardFormat(SHARD_ROWS, DIM, dtype)
    table = open_table(
        "t", fmt, placement, row_start=row_start, table_rows=TABLE_ROWS, checkpoint=checkpoint, group=group
    )
    if placement != "file":
        load_shards([table.shard], {"t": TABLE_ROWS}, checkpoint, group=group, progress=False)
    return table


def expected(path: Path, dtype: str, row_start: int, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The oracle: safetensors' reader, rows outside [row_start, row_start + SHARD_ROWS) and DEAD_ID zero."""
    tensors = load_file(str(path / "model.safetensors"))
    f = FORMATS[dtype]
    owned = (ids >= row_start) & (ids < row_start + SHARD_ROWS)
    index = torch.where(owned, ids, 0)

    def rows(whole: torch.Tensor) -> torch.Tensor:
        picked = whole.view(torch.uint8)[index]
        picked[~owned] = 0
        return picked

    stored = [rows(tensors["t.weight"])]
    if f.scale is not None:
        stored.append(rows(tensors[f"t.{f.scale_name}"]))
    out = {"stored": stored[0].view(f.weight), "packed": torch.cat(stored, dim=-1)}
    for out_dtype in OUTPUTS:
        values = dequantise(tensors, "t", dtype, out_dtype)[index]
        values.view(torch.uint8)[~owned] = 0  # +0.0
        out[str(out_dtype)] = out[f"{out_dtype} kept"] = values
    return out


def assert_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], case: str) -> None:
    assert got.keys() == want.keys()
    for kind in want:
        assert same_bits(got[kind], want[kind]), f"{case}: {kind}"


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_placement_format_and_row_range_reads_the_checkpoints_rows(
    placement: Placement, checkpoints: dict[str, Path]
) -> None:
    for dtype, path in checkpoints.items():
        for row_start in ROW_STARTS:
            case, ids = f"{placement} {dtype} rows from {row_start}", ids_for(row_start)
            table = open_loaded(placement, dtype, row_start, path)
            want = expected(path, dtype, row_start, ids)
            assert_equal(lookups(table, ids), want, case)
            stats = table.stats()
            assert (stats.placement, stats.row_start, stats.rows, stats.table_rows) == (
                placement, row_start, SHARD_ROWS, TABLE_ROWS
            ), case  # fmt: skip
            assert (stats.lookups, stats.ids) == (6, 6 * ids.numel()), case
            hot = torch.arange(TABLE_ROWS - 1, -1, -3)  # every third row, from the last: some owned, some not
            eager, scale = table.shard.readahead, table.shard.scale  # a file on disk: a RAM tier
            scales = scale.numel() * scale.element_size() if eager and scale is not None else 0
            budget = 10 * table.shard.format.row_bytes + state_bytes(10, TABLE_ROWS, 0, "static", eager)
            scales = scales if 4 * scales <= budget + scales else 0  # kept in RAM when a quarter of it at most
            budget += scales
            cached = table.keep_hot(budget, "cpu", policy="static", hot=hot)
            tier = table.stats().tier
            assert cached == 10 and tier is not None and tier.rows == 10, case
            assert_equal(lookups(table, ids), want, f"{case}, cached")
            assert table.tier is not None
            tier, hits = table.stats().tier, int(torch.isin(ids, table.tier.admission.held_rows()).sum())
            assert tier is not None and hits > 0, case
            assert (tier.hits, tier.misses, tier.lookups) == (6 * hits, 6 * (ids.numel() - hits), 6 * ids.numel()), case
            table.release()


def shm_mismatches(rank: int, world: int, checkpoints: dict[str, str]) -> list[str]:
    """Placement shm's cases in one rank (a group of one sharing a memfd, loaded through its leader),
    each against the oracle: the cases and lookup kinds that differ."""
    group = edist.new_group([0], "engram shared tables (test)")
    wrong = []
    for dtype, path in checkpoints.items():
        for row_start in ROW_STARTS:
            table, ids = open_loaded("shm", dtype, row_start, Path(path), group), ids_for(row_start)
            assert table.stats().placement == "shm" and table.group is group
            got, want = lookups(table, ids), expected(Path(path), dtype, row_start, ids)
            wrong += [f"{dtype} rows from {row_start}: {kind}" for kind in want if not same_bits(got[kind], want[kind])]
            table.release()
    return wrong


def test_placement_shm_reads_the_checkpoints_rows(checkpoints: dict[str, Path]) -> None:
    [wrong] = values(run_local(1, shm_mismatches, {d: str(p) for d, p in checkpoints.items()}, timeout=240))
    assert wrong == []


def test_the_loaders_copy_vllms_pieces_and_scales_held_as_bytes(checkpoints: dict[str, Path]) -> None:
    """Table.weight_loader as vLLM calls it: a table in split parts (checkpoint_start), vLLM's whole table
    (checkpoint_start None), and ue8m0 scales into a parameter that holds them as bytes; a piece of
    another width is refused by name."""
    path = checkpoints["fp8"]
    tensors = load_file(str(path / "model.safetensors"))
    table = open_table("t", ShardFormat(SHARD_ROWS, DIM, "fp8"), "host", row_start=72, table_rows=TABLE_ROWS)
    weight, scale = tensors["t.weight"], tensors["t.scale"]
    for start in range(0, TABLE_ROWS, 64):  # parts of 64 rows, as split_ngram_parts writes them
        table.weight_loader("weight")(table.weight, weight[start : start + 64], start)
    assert table.scale is not None
    table.weight_loader("scale")(table.scale.view(torch.uint8), scale, None)
    ids = ids_for(72)
    assert_equal(lookups(table, ids), expected(path, "fp8", 72, ids), "loaded by vLLM's calls")
    with pytest.raises(EngramError, match=r"t\.weight: the checkpoint's rows \[200, 32\] do not fit"):
        table.weight_loader("weight")(table.weight, weight[:, :32])


def test_a_shard_outside_its_table_or_a_wrong_output_is_refused(checkpoints: dict[str, Path]) -> None:
    with pytest.raises(EngramError, match=r"t: rows \[150, 250\) are not all in its 200 rows"):
        open_table("t", ShardFormat(SHARD_ROWS, DIM, "fp8"), "host", row_start=150, table_rows=TABLE_ROWS)
    with pytest.raises(EngramError, match=r"fp8 rows are looked up as torch.float8_e4m3fn \(as stored\)"):
        open_table("t", ShardFormat(SHARD_ROWS, DIM, "fp8"), "host", table_rows=TABLE_ROWS, out_dtype=torch.float16)
    with pytest.raises(EngramError, match="a file-backed table needs the checkpoint"):
        open_table("t", ShardFormat(SHARD_ROWS, DIM, "fp8"), "file", table_rows=TABLE_ROWS)


def test_prefetch_asks_for_a_cold_files_rows_once(checkpoints: dict[str, Path]) -> None:
    """Table.prefetch on a file-backed table on disk: the pages of the rows asked for are requested from
    the page cache once cold (bytes > 0), nothing once the lookup has read them; counted in stats()."""
    path = checkpoints["fp8"]
    if in_memory_fs(str(path)):
        pytest.skip("the temporary directory is on tmpfs, whose pages are memory, not page cache")
    table = open_loaded("file", "fp8", 72, path)
    drop_file_cache(path / "model.safetensors")
    ids = ids_for(72)
    asked = table.prefetch(ids)
    assert asked > 0 and table.stats().readahead_bytes == asked
    table.lookup(ids)
    assert table.prefetch(ids) == 0 and table.stats().readahead_bytes == asked
    memory = open_loaded("host", "fp8", 72, path)
    assert memory.prefetch(ids) == 0  # in memory: nothing to read
