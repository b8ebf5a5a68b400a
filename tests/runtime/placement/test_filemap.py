"""File-backed tables (file_backed=true): rows served from a read-only mapping of the safetensors files,
equal bit for bit to loaded tables; a truncated file is an error naming it, at open and while mapped
(in a child process, so a crash would be observed, not suffered); one copy of the pages per node."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engram.apps.local_ranks import run_local, values
from engram.errors import EngramError
from engram.memory.mapping import madvise
from engram.memory.registration import HOST_REGISTER_MAPPED, HOST_REGISTER_PORTABLE, HOST_REGISTER_READ_ONLY
from engram.ngram.spec import ModelSpec
from engram.ops import DEAD_ID, cpu, gather
from engram.ops.formats import FORMATS
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.file_reads import all_resident
from engram.runtime.placement.filemap import file_shard, in_memory_fs
from engram.runtime.placement.residency import drop_file_cache
from engram.runtime.plan import TableShardPlan, table_shards
from engram.runtime.rank_tables import open_tables
from engram.runtime.shard import ShardFormat, TableShard
from engram.runtime.table import Table
from engram.runtime.tiers.ram import RamTier
from tests.bits import same_bits
from tests.memory.fakes import FakeRuntime
from tests.runtime import workers
from tests.runtime.reference import dequantise, pick, plant_negative_zeros, read_tensors
from tests.runtime.shards import checkpoint_digests
from tests.runtime.specs import DS3, DS7, QWEN, SMALL

TABLE_BYTES = sum(ShardFormat(rows, SMALL.head_dim, SMALL.dtype).nbytes for rows in SMALL.layout.table_rows)


@pytest.mark.parametrize(("spec", "tp"), [(DS7, 1), (DS7, 2), (DS3, 2), (DS3, 4), (SMALL, 2)])
def test_file_shards_equal_loaded_shards(spec: ModelSpec, tp: int, tmp_path: Path) -> None:
    """fp8 (weights and ue8m0 scales as separate tensors) and bf16 checkpoints; head shards (DS7 at TP 2)
    and row shards (DS3 at TP 4): every id of the table, DEAD_ID, sorted and plain, in bf16 and raw."""
    write_checkpoint(spec, tmp_path, seed=3)
    checkpoint = Checkpoint(tmp_path)
    for rank in range(tp):
        plans = table_shards(spec, rank, tp)
        mapped = open_tables(spec, checkpoint, "file", plans=plans, progress=False)
        loaded = open_tables(spec, checkpoint, "host", plans=plans, progress=False)
        for a, b in zip(mapped, loaded, strict=True):
            assert a.placement == "file" and b.placement == "host"
            assert (a.row_start, a.rows) == (b.row_start, b.rows)
            table_rows = next(p.table_rows for p in plans if p.table == a.name)
            ids = torch.cat([torch.arange(table_rows), torch.tensor([DEAD_ID, 0, table_rows - 1])])
            for sorted_form in (False, True):
                for out_dtype in (torch.bfloat16, a.weight.dtype):
                    scale_a, scale_b = (a.scale, b.scale) if out_dtype == torch.bfloat16 else (None, None)
                    got = gather(a.weight, scale_a, ids, a.row_start, table_rows, out_dtype, sorted_form)
                    want = gather(b.weight, scale_b, ids, b.row_start, table_rows, out_dtype, sorted_form)
                    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize(
    ("spec", "dtype"),
    [(DS7, "fp8"), (DS3, "bf16"), (DS3, "fp16"), (DS3, "fp32"), (QWEN, "fp8-table"), (QWEN, "nvfp4")],
)
def test_file_shards_at_an_offset_hold_the_checkpoints_rows(spec: ModelSpec, dtype: str, tmp_path: Path) -> None:
    """Every row format, a shard starting at row 37 (no multiple of a page, a block or a row group): its
    views hold the bytes safetensors' own reader gives for those rows, and lookups through it return them
    dequantised as tests/runtime/reference.py does from the format's definition, bit for bit (negative
    zeros planted), zeros for DEAD_ID and for rows outside the shard."""
    spec = dataclasses.replace(spec, dtype=dtype)
    write_checkpoint(spec, tmp_path, seed=5)
    plant_negative_zeros(tmp_path, spec)
    tensors = read_tensors(tmp_path)
    table, rows = spec.table_names()[0], spec.layout.table_rows[0]
    start, stop = 37, rows - 41
    f = FORMATS[dtype]
    shard = file_shard(table, ShardFormat(stop - start, spec.head_dim, dtype), start, rows, Checkpoint(tmp_path), None)
    assert shard.placement == "file"
    parts = [("weight", shard.weight), (f.scale_name, shard.scale)] if f.scale else [("weight", shard.weight)]
    for suffix, view in parts:
        want = tensors[f"{table}.{suffix}"][start:stop]
        assert view.dtype == want.dtype and torch.equal(view.view(torch.uint8), want.view(torch.uint8)), suffix
    if f.table_scale:
        assert shard.table_scale is not None and torch.equal(
            shard.table_scale.reshape(()), tensors[f"{table}.{f.table_scale_name}"]
        )
    plan = TableShardPlan(table, rows, "row", start, stop, 0, spec.layout.columns)
    layer = EngramEmbedding(shard, plan, columns=spec.layout.columns)
    ids = torch.randint(0, rows, (300, spec.layout.columns), generator=torch.Generator().manual_seed(2))
    ids[0, :3] = torch.tensor([start, stop - 1, DEAD_ID])
    ids[1, :2] = torch.tensor([start - 1, stop])  # the neighbours just outside the shard
    owned = ((ids >= start) & (ids < stop))[..., None]
    full = pick(dequantise(tensors, table, dtype, torch.bfloat16), ids)
    want = torch.where(owned, full, torch.zeros((), dtype=full.dtype))
    assert same_bits(layer(ids), want)


def test_a_truncated_file_is_refused_at_open(tmp_path: Path) -> None:
    write_checkpoint(SMALL, tmp_path, seed=1)
    victim = sorted(tmp_path.glob("*.safetensors"))[0]
    os.truncate(victim, victim.stat().st_size - 4096)
    with pytest.raises(EngramError, match=rf"{victim}: truncated: tensor .* ends at byte"):
        open_tables(SMALL, Checkpoint(tmp_path), "file", progress=False)


def test_pt_checkpoints_are_refused_with_the_fix(tmp_path: Path) -> None:
    tables = {}
    for name in DS3.table_names():
        rows = next(p.table_rows for p in table_shards(DS3, 0, 1) if p.table == name)
        tables[f"{name}.weight"] = torch.zeros((rows, DS3.head_dim), dtype=torch.bfloat16)
    torch.save(tables, tmp_path / "tables.pt")
    with pytest.raises(
        EngramError, match=r"served from safetensors checkpoints; .*\.weight is not in a safetensors file"
    ):
        open_tables(DS3, Checkpoint(tmp_path), "file", progress=False)


def test_split_parts_that_do_not_tile_the_table_are_refused_naming_the_missing_one(tmp_path: Path) -> None:
    """A table split into parts is served from them (test_split_tables.py), but only when the parts cover
    it: a missing part is refused before anything is mapped, naming it."""
    [name] = DS3.table_names()[:1]
    rows = DS3.layout.table_rows[0]
    weight = torch.zeros((rows, DS3.head_dim), dtype=torch.bfloat16)
    size = -(-rows // 3)
    save_file(
        {f"{name}.shard_0.weight": weight[:size], f"{name}.shard_2.weight": weight[2 * size :]},
        str(tmp_path / "m.safetensors"),
    )
    with pytest.raises(EngramError, match=rf"checkpoint does not match the model: {name}\.shard_1\.weight is missing"):
        open_tables(DS3, Checkpoint(tmp_path), "file", progress=False)


@pytest.mark.parametrize("row_start", [-1, 1])
def test_a_shard_reaching_past_its_table_is_refused(row_start: int, tmp_path: Path) -> None:
    """The view would read the file's next tensor (or the header before it): refused before mapping."""
    [name] = DS3.table_names()[:1]
    rows = DS3.layout.table_rows[0]
    save_file(
        {f"{name}.weight": torch.zeros((rows, DS3.head_dim), dtype=torch.bfloat16)}, str(tmp_path / "m.safetensors")
    )
    fmt = ShardFormat(rows, DS3.head_dim, "bf16")
    with pytest.raises(EngramError) as raised:
        file_shard(name, fmt, row_start, rows, Checkpoint(tmp_path), None)
    assert str(raised.value) == (
        f"{name}: rows [{row_start:,}, {row_start + rows:,}) are not all in its {rows:,} rows; a file-backed shard "
        "must lie within its table"
    )


CHILD = textwrap.dedent(
    """
    import os, sys, torch
    from engram.errors import EngramError
    from engram.ngram.spec import ModelSpec
    from engram.runtime.embedding import EngramEmbedding
    from engram.runtime.checkpoints.loader import Checkpoint
    from engram.runtime.plan import table_shards
    from engram.runtime.rank_tables import open_tables
    from tests.runtime.specs import SMALL

    path, how = sys.argv[1], sys.argv[2]
    plans = table_shards(SMALL, 0, 1)
    shards = open_tables(SMALL, Checkpoint(path), "file", plans=plans, progress=False)
    layer = EngramEmbedding(shards[-1], plans[-1], columns=SMALL.layout.columns)
    ids = torch.arange(plans[-1].table_rows - 2000, plans[-1].table_rows).view(-1, 1).repeat(1, SMALL.layout.columns)
    before = layer(ids)
    for file in sorted(os.listdir(path)):
        if file.endswith(".safetensors"):
            os.truncate(os.path.join(path, file), 4096)  # under the mapping: its pages past 4 KiB are gone
    if how == "unguarded":  # a read outside the guarded kernels still dies of SIGBUS, as it would without us
        print(int(shards[-1].weight[-1].view(torch.uint8).sum()))
    try:
        if how == "cache":  # a device cache chosen from a profile reads its hot rows from the file
            from engram.runtime.tiers.ram import RamTier
            RamTier(shards[-1], 4096).warm(ids[:, 0].contiguous())
        else:
            layer(ids)
    except EngramError as exc:
        print("ERROR", exc)
        sys.exit(0)
    print("NO ERROR", before.shape)
    sys.exit(1)
    """
)


def run_child(checkpoint: Path, how: str) -> subprocess.CompletedProcess[str]:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", CHILD, str(checkpoint), how],
        capture_output=True, text=True, timeout=180, env=env, cwd=root, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("how", ["guarded", "cache"])
def test_a_file_truncated_while_mapped_is_an_error_naming_it(tmp_path: Path, small_checkpoint: Path, how: str) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, copy)
    done = run_child(copy, how)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f"ERROR {copy}/") and ": truncated at offset 4,096: the checkpoint shrank from" in line, line


@pytest.mark.parametrize("how", ["renamed over", "unlinked"])
def test_an_id_past_the_table_is_named_as_such_after_the_file_is_replaced(
    tmp_path: Path, small_checkpoint: Path, how: str
) -> None:
    """The mapped inode is what the table reads: after its name is taken by a smaller file or removed, its
    rows are still served bit-equal, and an id past the table is that error, not one about the new file."""
    copy = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, copy)
    plans = table_shards(SMALL, 0, 1)
    [shard] = open_tables(SMALL, Checkpoint(copy), "file", plans=plans[:1], progress=False)
    [loaded] = open_tables(SMALL, Checkpoint(small_checkpoint), "host", plans=plans[:1], progress=False)
    rows = plans[0].table_rows
    table, plain = Table(shard, rows), Table(loaded, rows)
    victim = copy / "model.safetensors"
    if how == "unlinked":
        victim.unlink()
    else:
        small = tmp_path / "small.safetensors"
        small.write_bytes(b"\0" * 4096)
        os.replace(small, victim)
    ids = torch.arange(rows - 64, rows)
    assert same_bits(table.lookup(ids), plain.lookup(ids))
    with pytest.raises(EngramError, match=f"^row id {rows} is outside the table's {rows} rows"):
        table.lookup(torch.tensor([0, rows]))
    table.release()
    plain.release()


def test_an_unguarded_read_still_dies_of_sigbus(tmp_path: Path, small_checkpoint: Path) -> None:
    """The guard catches only its own reads; any other SIGBUS reaches the handler that was there before
    (here faulthandler, which reports and re-raises it)."""
    copy = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, copy)
    done = run_child(copy, "unguarded")
    assert done.returncode == -7, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "Fatal Python error: Bus error" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("dp", [4])  # four holders of one page cache; two would add nothing (suite time)
def test_file_backed_tables_are_one_copy_per_node(dp: int, small_checkpoint: Path) -> None:
    results = values(run_local(dp, workers.load_tables, SMALL, str(small_checkpoint), "file", timeout=240))
    expected = checkpoint_digests(small_checkpoint, SMALL)
    assert all(r["digests"] == expected for r in results)
    total_pss = sum(r["pss"] for r in results)
    assert TABLE_BYTES * 0.95 <= total_pss <= TABLE_BYTES * 1.15, (total_pss, TABLE_BYTES)


def test_a_checkpoint_on_tmpfs_is_registered_read_only_for_uva(tmp_path: Path, small_checkpoint: Path) -> None:
    """On a GPU the page cache's own pages of a tmpfs checkpoint are pinned without write access and read
    over UVA; a checkpoint on any other file system is left to the host-thread gather (no registration)."""
    on_disk = open_tables(SMALL, Checkpoint(small_checkpoint), "file", runtime=FakeRuntime(), progress=False)
    assert [s.device_pointer for s in on_disk] == [None, None]
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        for file in small_checkpoint.iterdir():
            shutil.copy(file, shm / file.name)
        runtime = FakeRuntime()
        shards = open_tables(SMALL, Checkpoint(shm), "file", runtime=runtime, progress=False)
        assert [s.device_pointer for s in shards] == [s.weight.data_ptr() for s in shards]
        flags = {call[3] for call in runtime.calls if call[0] == "register"}
        assert flags == {HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED | HOST_REGISTER_READ_ONLY}
        assert all(s.note.endswith("(in-memory file system)") for s in shards)
    finally:
        shutil.rmtree(shm)


def drop_pages(shards: list[TableShard]) -> None:
    """Out of the page cache: our own mappings of the files first (a mapped page cannot be dropped)."""
    for mapping in {m.addr: m for s in shards for m in s.files}.values():
        madvise(mapping.addr, mapping.length, 4)  # MADV_DONTNEED
        drop_file_cache(mapping.path or "")


def test_a_lookup_asks_for_its_rows_pages_only_when_some_are_cold(
    tmp_path: Path, small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file on disk may leave the page cache at any time: every lookup probes a sample of its rows' pages
    and, when one is out, asks for all of them at once (MADV_WILLNEED); when all are in, nothing is asked.
    The rows are the same either way."""
    if in_memory_fs(str(small_checkpoint)):
        pytest.skip("the temporary directory is on tmpfs, whose pages never leave the page cache")
    plans = table_shards(SMALL, 0, 1)
    mapped = open_tables(SMALL, Checkpoint(small_checkpoint), "file", plans=plans, progress=False)
    assert [s.readahead for s in mapped] == [True, True]
    assert all("read ahead per lookup" in s.note for s in mapped)
    library = cpu.cpu_library()
    asked: list[int] = []
    real = library.engram_readahead_cpu
    monkeypatch.setattr(library, "engram_readahead_cpu", lambda *a: asked.append(a[7]) or real(*a))
    module = EngramEmbedding(mapped[0], plans[0], columns=SMALL.layout.columns)
    ids = torch.randint(0, plans[0].table_rows, (500, SMALL.layout.columns), generator=torch.Generator().manual_seed(1))
    ids[0, 0] = DEAD_ID
    warm = module(ids)
    asked.clear()
    module(ids)
    assert asked == []  # every probed page resident: no madvise at all
    drop_pages(mapped)
    flat = ids.reshape(-1)
    assert not all_resident(mapped[0].weight, mapped[0].row_start, flat)
    cold = module(ids)
    assert asked and asked[0] == flat.numel()  # one call over every id of the lookup, weights then scales
    assert torch.equal(cold.view(torch.uint8), warm.view(torch.uint8))
    loaded = open_tables(SMALL, Checkpoint(small_checkpoint), "host", plans=plans, progress=False)
    want = EngramEmbedding(loaded[0], plans[0], columns=SMALL.layout.columns)(ids)
    assert torch.equal(cold.view(torch.uint8), want.view(torch.uint8))


def test_device_cache_rows_of_a_file_backed_table_are_read_guarded(small_checkpoint: Path) -> None:
    """The hot rows a device cache copies come through the guarded kernel and equal the loaded ones."""
    plans = table_shards(SMALL, 0, 1)
    mapped = open_tables(SMALL, Checkpoint(small_checkpoint), "file", plans=plans, progress=False)
    loaded = open_tables(SMALL, Checkpoint(small_checkpoint), "host", plans=plans, progress=False)
    tiers = []
    for shards in (mapped, loaded):
        tiers.append([RamTier(s, 8) for s in shards])
        for i, tier in enumerate(tiers[-1]):
            assert tier.warm(torch.tensor([5, 1, plans[i].table_rows - 1, 40])) == 4
    for first, second in zip(tiers[0], tiers[1], strict=True):
        assert torch.equal(first.admission.held_rows(), second.admission.held_rows())
        a, b = first.rows, second.rows  # each warm start fills slots 0.. in the profile's order
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))
        assert a.scale is not None and b.scale is not None
        assert torch.equal(a.scale.view(torch.uint8), b.scale.view(torch.uint8))


def test_released_shards_leave_the_shared_mapping_to_the_others(small_checkpoint: Path) -> None:
    checkpoint = Checkpoint(small_checkpoint)
    first = open_tables(SMALL, checkpoint, "file", progress=False)
    second = open_tables(SMALL, checkpoint, "file", progress=False)
    assert first[0].files == second[0].files  # one mapping per file, shared by every shard of it
    assert [s.release() for s in first] == [False, False]  # still mapped: `second` and the checkpoint hold it
    again = open_tables(SMALL, checkpoint, "file", progress=False)
    for a, b in zip(again, second, strict=True):
        assert torch.equal(a.weight.view(torch.uint8), b.weight.view(torch.uint8))


def test_a_gpu_without_read_only_registration_gathers_tmpfs_tables_on_host_threads(
    small_checkpoint: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Where device attribute 113 is 0, a tmpfs checkpoint is not registered (cudaHostRegisterReadOnly
    would fail with error 801) but served like one on disk, with a one-line warning."""
    shm = Path(tempfile.mkdtemp(dir="/dev/shm"))
    try:
        for file in small_checkpoint.iterdir():
            shutil.copy(file, shm / file.name)
        runtime = FakeRuntime(read_only=0)
        with caplog.at_level("WARNING", logger="engram"):
            shards = open_tables(SMALL, Checkpoint(shm), "file", runtime=runtime, progress=False)
        assert [s.device_pointer for s in shards] == [None, None]
        assert not [call for call in runtime.calls if call[0] == "register"]
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) == 1 and warnings[0].startswith(
            "engram: this GPU cannot register read-only host memory (device attribute 113 is 0): file-backed tables in "
        )
    finally:
        shutil.rmtree(shm)
