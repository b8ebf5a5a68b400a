"""The RAM tier (ram_cache_bytes over a checkpoint file on disk): its CLOCK choice against CLOCK taken one
slot at a time, and its lookups (through the page cache and past it) bit-equal to the loaded table's,
whatever fails or changes under them: ids out of range, failed reads, a rewritten file, a file system or
io_uring that refuses."""

from __future__ import annotations

import errno
import gc
import itertools
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.memory.mapping import PAGE, madvise
from engram.ops import DEAD_ID
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.lookup.file import FileReader
from engram.runtime.lookup.ram_tier import RamTierReader
from engram.runtime.placement import direct_reads
from engram.runtime.placement import filemap as filemap_module
from engram.runtime.placement.direct_reads import DIRECT_GAP, DIRECT_MAX_RANGE, direct_file
from engram.runtime.placement.filemap import in_files
from engram.runtime.placement.residency import (
    MADV_DONTNEED,
    DiskReads,
    ResidentBudget,
    drop_file_cache,
    resident_bytes,
    resident_pages,
)
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables
from engram.runtime.table import PACKED, Table
from engram.runtime.tiers import base as base_module
from engram.runtime.tiers import ram as ram_module
from engram.runtime.tiers.budget import capacity_for, state_bytes
from engram.runtime.tiers.clock import PINNED, ClockAdmission
from engram.runtime.tiers.device import DeviceTier
from engram.runtime.tiers.open import Tier
from engram.runtime.tiers.ram import RamTier
from tests.bits import same_bits
from tests.runtime.placement.reference import direct_ranges
from tests.runtime.specs import SMALL


def zipf_ids(generator: torch.Generator, rows: int, count: int, shift: int = 0) -> torch.Tensor:
    """Zipfian ids over [0, rows), rank r at row (r * 7919 + shift) % rows: a shift is a domain switch."""
    weights = 1.0 / torch.arange(1, rows + 1, dtype=torch.float64)
    ranks = torch.multinomial(weights, count, replacement=True, generator=generator)
    return (ranks * 7919 + shift) % rows


def file_tables(checkpoint: Path) -> tuple[Table, Table, int]:
    """Layer 1's table mapped from the checkpoint (a file on disk) and loaded in memory, and its rows."""
    plans = table_shards(SMALL, 0, 1)
    mapped = open_tables(SMALL, Checkpoint(checkpoint), "file", plans=plans, progress=False)[0]
    loaded = open_tables(SMALL, Checkpoint(checkpoint), "host", plans=plans, progress=False)[0]
    rows = plans[0].table_rows
    return Table(mapped, rows), Table(loaded, rows), rows


@pytest.fixture(params=["direct", "page cache"])
def read_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """How a RAM tier reads its misses: past the page cache (O_DIRECT, where the file system takes it:
    ENGRAM_DIRECT_READS=1, whatever memory this machine has to spare), or through it (0). Set before the
    file is mapped: its descriptor is kept then."""
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0" if request.param == "page cache" else "1")
    return str(request.param)


def reads_as_told(table: Table, read_path: str) -> Tier:
    """The table's RAM tier, which reads its misses the way `read_path` says (skipped where direct reads
    cannot work: a file system that refuses O_DIRECT)."""
    tier = table.tier
    assert tier is not None and isinstance(tier, RamTier)
    if read_path == "direct" and not tier.direct and not direct_file(table.shard, table.shard.weight):
        pytest.skip("this file system refuses O_DIRECT")
    assert tier.direct == (read_path == "direct")
    return tier


def drop_pages(table: Table) -> None:
    """The table's file out of the page cache. A read-ahead's pages still being read (the gap pages of a
    coalesced range, which no gather waited for) land after a drop, so it drops until none is resident,
    a bounded number of times. A mapping of the file that an earlier test left to the garbage collector
    (a failed lookup's traceback holds its table) keeps the pages it mapped: collected first."""
    gc.collect()
    for _ in range(200):
        for mapping in table.shard.files:
            madvise(mapping.addr, mapping.length, MADV_DONTNEED)
            assert mapping.path is not None and drop_file_cache(mapping.path, file_id=mapping.file_id)
        if resident_bytes(table.shard.files) == 0:
            return
        time.sleep(0.01)
    raise AssertionError("the file's pages stayed in the page cache after 200 drops")


def direct_tier(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Table, Table, int, Tier]:
    """file_tables' pair, the mapped one with a RAM tier of 300 rows that reads past the page cache, and
    the file's pages dropped (a miss whose pages are cached is copied from them, not read)."""
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "1")
    table, plain, rows = file_tables(checkpoint)
    assert table.keep_hot(300 * table.shard.format.row_bytes + state_bytes(300, rows, 0, "online", True), "cpu", "ram")
    tier = reads_as_told(table, "direct")
    drop_pages(table)
    return table, plain, rows, tier


def check_eager_state(admission: ClockAdmission) -> None:
    """Slots and rows in one-to-one correspondence: the index maps each held row to the slot that says it
    holds that row, every row held is distinct and ours, and nothing past `used` is held."""
    held = admission.held_rows()
    assert held.numel() == admission.used == admission.index.held
    found, slot = admission.index.find(held)
    assert bool(found.all()) and torch.equal(torch.sort(slot).values, torch.arange(admission.used))
    assert torch.equal(admission.row_of_slot[slot].to(torch.int64) + admission.rows[0], held)
    assert bool((held >= admission.rows[0]).all()) and bool((held < admission.rows[1]).all())
    assert bool((admission.row_of_slot[admission.used :] == -1).all())


def rows_of_slots(admission: ClockAdmission) -> list[int | None]:
    """The global row each slot holds (None: empty), as ScalarClock keeps them."""
    return [None if r < 0 else r + admission.rows[0] for r in admission.row_of_slot.tolist()]


class ScalarClock:
    """CLOCK written from its definition, one row at a time: each missed row of ours (ascending) takes the
    next free slot, else the hand moves on, clearing the set bits it passes, to the first clear one; it
    passes over the slots of the rows this lookup hit or filled, which it reads once they are all in, and
    so admits at most as many rows as the slots it does not hit. A row comes in clear; the rows the lookup
    hit end with their bits set."""

    def __init__(self, capacity: int, rows: tuple[int, int]) -> None:
        self.capacity, self.rows = capacity, rows
        self.row_of_slot: list[int | None] = [None] * capacity
        self.referenced = [False] * capacity
        self.hand = 0

    def warm(self, rows: list[int]) -> None:
        """A profile's rows in the first slots, referenced."""
        for slot, row in enumerate(rows):
            self.row_of_slot[slot], self.referenced[slot] = row, True

    def lookup(self, ids: list[int]) -> None:
        slot_of = {row: slot for slot, row in enumerate(self.row_of_slot) if row is not None}
        hit = {slot_of[row] for row in set(ids) if row in slot_of}
        missed = sorted(row for row in set(ids) if row not in slot_of and self.rows[0] <= row < self.rows[1])
        placed: list[int] = []
        for row in missed[: self.capacity - len(hit)]:
            if None in self.row_of_slot:
                slot = self.row_of_slot.index(None)
            else:
                while self.referenced[self.hand] or self.hand in hit or self.hand in placed:
                    self.referenced[self.hand] = False
                    self.hand = (self.hand + 1) % self.capacity
                slot, self.hand = self.hand, (self.hand + 1) % self.capacity
            self.row_of_slot[slot] = row
            self.referenced[slot] = False
            placed.append(slot)
        for slot in hit:
            self.referenced[slot] = True


@pytest.mark.parametrize("capacity", [7, 300, 5000])
def test_eager_admission_is_clock(capacity: int) -> None:
    """From a warm start that fills a third of it, lookups of Zipfian ids (with others' rows, repeats and
    a domain switch) leave exactly the slots, bits and hand of CLOCK one row at a time (ScalarClock):
    the free slots filled and held ones swept in one lookup, small tiers whose sweeps lap them, and a
    large one swept in windows."""
    generator = torch.Generator().manual_seed(capacity)
    admission, oracle = ClockAdmission(capacity, (1000, 19000)), ScalarClock(capacity, (1000, 19000))
    profile = torch.arange(18999, 18999 - 3 * (capacity // 3), -3)
    admission.warm(profile)
    oracle.warm(profile.tolist())
    evictions = 0
    for step in range(60):
        ids = zipf_ids(generator, 20_000, 200 if step % 10 else 3000, shift=0 if step < 30 else 4321)
        held_before = set(admission.held_rows().tolist())
        change = admission.admit(ids)
        oracle.lookup(ids.tolist())
        check_eager_state(admission)
        assert rows_of_slots(admission) == oracle.row_of_slot, step
        assert admission.referenced.tolist() == oracle.referenced and admission.hand == oracle.hand, step
        held = set(admission.held_rows().tolist())
        assert set(change.admitted.tolist()) == held - held_before
        assert change.evicted == len(held_before - held)
        evictions += change.evicted
    assert evictions > 0
    static = ClockAdmission(4, (0, 100), policy="static")
    static.warm(torch.tensor([5, 7]))
    assert static.admit(torch.tensor([1, 2, 3])).admitted.numel() == 0 and static.held_rows().tolist() == [5, 7]


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 40),
    st.lists(st.integers(0, 120), max_size=40),
    st.lists(st.lists(st.integers(-5, 130), max_size=90), min_size=1, max_size=12),
)
def test_eager_admission_is_clock_for_any_lookups(capacity: int, profile: list[int], lookups: list[list[int]]) -> None:
    """Any capacity, warm start (a profile of rows, some not ours, some past the capacity) and lookups
    (repeats, rows not ours, more misses than slots) leave the slots, bits and hand of ScalarClock."""
    rows = (10, 110)
    admission, oracle = ClockAdmission(capacity, rows), ScalarClock(capacity, rows)
    hot = torch.tensor(list(dict.fromkeys(profile)), dtype=torch.int64)
    admission.warm(hot)
    oracle.warm([r for r in hot.tolist() if rows[0] <= r < rows[1]][:capacity])
    for ids in lookups:
        admission.admit(torch.tensor(ids, dtype=torch.int64))
        oracle.lookup(ids)
        check_eager_state(admission)
        assert rows_of_slots(admission) == oracle.row_of_slot
        assert admission.referenced.tolist() == oracle.referenced and admission.hand == oracle.hand


@pytest.mark.parametrize("output", ["bf16", "packed", "out"])
def test_a_ram_tier_serves_rows_bit_equal_to_the_loaded_table(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, output: str, read_path: str
) -> None:
    """Decode- and prefill-sized lookups (the latter read in many small batches) through a RAM tier that
    fills, then evicts: every row equals the loaded table's, the counters equal counts made outside, the
    tier's slots hold the file's bytes, and its bytes are exactly its budget's formula."""
    monkeypatch.setattr(FileReader, "batch_rows", 300)
    table, plain, rows = file_tables(small_checkpoint)
    row_bytes = table.shard.format.row_bytes
    budget = 2000 * row_bytes + state_bytes(2000, rows, 0, "online", eager=True)
    assert table.keep_hot(budget, "cpu", "ram") == 2000 == capacity_for(budget, row_bytes, rows, eager=True)
    tier = reads_as_told(table, read_path)
    assert tier is not None and isinstance(tier, RamTier) and isinstance(tier.admission, ClockAdmission)
    generator = torch.Generator().manual_seed(8)
    hits = looked_up = owned_misses = 0
    for step in range(14):
        count = 4096 if step % 5 == 0 else 256
        ids = zipf_ids(generator, rows, count * 8, shift=0 if step < 7 else 911).view(count, 8)
        ids[0, :2] = torch.tensor([DEAD_ID, DEAD_ID])
        held = tier.admission.held_rows()
        hit = torch.isin(ids, held)
        hits, looked_up, owned_misses = (
            hits + int(hit.sum()),
            looked_up + ids.numel(),
            owned_misses + int((~hit & (ids >= 0)).sum()),
        )
        asked = ids.to(torch.int32) if step % 2 else ids  # a lookup takes int32 ids as well
        if output == "packed":
            assert torch.equal(table.lookup(asked, output=PACKED), plain.lookup(ids, output=PACKED)), step
        elif output == "out":
            out = torch.full((count, 8, table.shard.format.dim), 7.0)
            assert table.lookup(asked, out) is out and same_bits(out, plain.lookup(ids, output=torch.float32)), step
        else:
            assert same_bits(table.lookup(asked), plain.lookup(ids)), step
        check_eager_state(tier.admission)
        slots = tier.admission.index.find(tier.admission.held_rows())[1]
        stored = table.shard.weight.view(torch.uint8)[tier.admission.held_rows() - table.row_start]
        assert torch.equal(tier.rows.weight.view(torch.uint8)[slots], stored)
    stats = tier.stats()
    assert (stats.hits, stats.lookups, stats.misses) == (hits, looked_up, looked_up - hits) and hits > 0
    assert stats.bytes_missed == owned_misses * row_bytes and stats.evictions > 0
    assert stats.rows == stats.admissions - stats.evictions == 2000
    assert stats.bytes == 2000 * row_bytes + state_bytes(2000, rows, 0, "online", eager=True) <= budget
    assert table.refresh() == 0  # nothing is left for a refresh to do
    table.release()
    plain.release()


def test_a_failed_ram_tier_lookup_leaves_no_row_pinned_and_no_row_wrong(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, read_path: str
) -> None:
    """An id outside the table fails a lookup before the tier changes; a read or copy into the tier that
    fails (as a file that shrank fails it) leaves the tier holding nothing rather than rows it never got,
    and no slot pinned: the lookups after it are bit-equal and the tier fills again."""
    monkeypatch.setattr(FileReader, "batch_rows", 100)
    table, plain, rows = file_tables(small_checkpoint)
    assert table.keep_hot(300 * table.shard.format.row_bytes + state_bytes(300, rows, 0, "online", True), "cpu", "ram")
    tier = reads_as_told(table, read_path)
    assert isinstance(tier.admission, ClockAdmission)
    generator = torch.Generator().manual_seed(5)
    table.lookup(zipf_ids(generator, rows, 2048).view(256, 8))
    held, state = tier.admission.held_rows(), tier.admission.referenced.clone()
    with pytest.raises(EngramError, match="outside the table"):
        table.lookup(torch.tensor([[0, 1, rows]]))
    assert torch.equal(tier.admission.held_rows(), held) and torch.equal(tier.admission.referenced, state)
    calls = []

    def fail_second(*args: object) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 2:
            raise EngramError("the checkpoint shrank")
        return real(*args)  # type: ignore[arg-type]

    if tier.direct:
        drop_pages(table)  # pages in the page cache would be copied from there, not read
    copies = "read_direct" if tier.direct else "stored_rows"  # what brings the admitted rows' bytes
    where = ram_module if tier.direct else base_module
    real = getattr(where, copies)
    monkeypatch.setattr(where, copies, fail_second)
    ids = zipf_ids(generator, rows, 4096, shift=333).view(512, 8)
    with pytest.raises(EngramError, match="shrank"):
        table.lookup(ids)
    assert len(calls) == 2 and tier.admission.used == 0 and not bool((tier.admission.referenced == PINNED).any())
    monkeypatch.setattr(where, copies, real)
    for _ in range(3):
        assert same_bits(table.lookup(ids), plain.lookup(ids))
        check_eager_state(tier.admission)
        assert not bool((tier.admission.referenced == PINNED).any())
    assert tier.admission.used == 300
    table.release()
    plain.release()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8, torch.bool, torch.int16])
def test_ids_of_another_dtype_are_refused_with_a_tier_as_without(small_checkpoint: Path, dtype: torch.dtype) -> None:
    """Row ids are int64 or int32 on every path: a float id through the RAM tier is not truncated to a row
    (0.5 and 1.7 are not rows 0 and 1), nor a bool or a byte taken for one; the tier records nothing."""
    table, plain, rows = file_tables(small_checkpoint)
    assert table.keep_hot(64 * table.shard.format.row_bytes + state_bytes(64, rows, 0, "online", True), "cpu", "ram")
    tier = table.tier
    assert tier is not None and isinstance(tier, RamTier)
    ids = torch.tensor([0.5, 1.7]).to(dtype)
    for each in (table, plain):
        with pytest.raises(EngramError, match=f"^ids must be int64 or int32 row ids; got {dtype} \\[2\\] on cpu$"):
            each.lookup(ids)
        with pytest.raises(EngramError, match="ids must be int64 or int32"):
            each.prefetch(ids)
    assert tier.admission.used == 0 and table.lookups == 0
    table.release()
    plain.release()


def rewrite_in_place(checkpoint: Path, seed: int) -> None:
    """Each file of `checkpoint` overwritten in place by the same layout's with other values (same inode,
    same size: what `cp new.safetensors model.safetensors` does)."""
    other = checkpoint.with_name(checkpoint.name + f"-seed{seed}")
    write_checkpoint(SMALL, other, seed=seed)
    for new in sorted(other.iterdir()):
        old = checkpoint / new.name
        if new.suffix == ".safetensors":
            assert old.stat().st_size == new.stat().st_size
            with open(old, "r+b") as f:
                f.write(new.read_bytes())
        else:
            old.write_bytes(new.read_bytes())  # its manifest and config


def tiered_file_table(checkpoint: Path, tier: str, read_path: str) -> tuple[Table, torch.Tensor]:
    """SMALL's checkpoint written at `checkpoint`, layer 1's table mapped from it with a tier of 400 rows
    (`tier`: "ram", or "device" with a window of 2,048 ids, the checkpoint then on tmpfs: a file on disk
    takes no device tier), and the ids three lookups gave it."""
    write_checkpoint(SMALL, checkpoint, seed=7)
    table, _, rows = file_tables(checkpoint)
    window = 2048
    budget = 400 * table.shard.format.row_bytes + state_bytes(
        400, rows, 0 if tier == "ram" else window, "online", tier == "ram"
    )
    assert table.keep_hot(budget, "cpu", tier, **({} if tier == "ram" else {"window_ids": window}))  # type: ignore[arg-type]
    assert table.tier is not None
    if tier == "ram":
        reads_as_told(table, read_path)
    else:
        assert isinstance(table.tier, DeviceTier) and not table.shard.readahead, "a device tier over a file in memory"
    ids = zipf_ids(torch.Generator().manual_seed(3), rows, 2048).view(256, 8)
    for _ in range(3):
        table.lookup(ids)
        table.refresh()
    return table, ids


@pytest.mark.parametrize("tier", ["ram", "device"])
def test_a_file_rewritten_in_place_is_served_as_it_now_is(
    tmp_path: Path, shm_tmp: Path, read_path: str, tier: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After the checkpoint is rewritten in place, a tier's rows are the file's as it now is, hits as
    misses (its admitted rows let go, with a word), as the same lookups without a tier are."""
    checkpoint = (tmp_path if tier == "ram" else shm_tmp) / "ckpt"
    table, ids = tiered_file_table(checkpoint, tier, read_path)
    held = table.tier.admission.used
    assert held > 0
    rewrite_in_place(checkpoint, seed=8)
    fresh = file_tables(checkpoint)[1]  # loaded into memory from the rewritten file
    with caplog.at_level(logging.WARNING, logger="engram"):
        for _ in range(2):
            assert same_bits(table.lookup(ids), fresh.lookup(ids))
    assert [r.getMessage() for r in caplog.records if "changed while mapped" in r.getMessage()] == [
        f"engram: {checkpoint / 'model.safetensors'} changed while mapped: {table.name}'s tier lets its "
        f"{held} rows go and reads them again from the file"
    ]
    table.release()
    fresh.release()


def both_tables(checkpoint: Path) -> list[Table]:
    """Both of SMALL's tables mapped from one Checkpoint: shards of one file, sharing its one mapping."""
    plans = table_shards(SMALL, 0, 1)
    shards = open_tables(SMALL, Checkpoint(checkpoint), "file", plans=plans, progress=False)
    return [Table(shard, plan.table_rows) for shard, plan in zip(shards, plans, strict=True)]


def loaded_tables(checkpoint: Path) -> list[Table]:
    """Both tables read into memory from the file as it is now (pread): the oracle of what it holds."""
    plans = table_shards(SMALL, 0, 1)
    shards = open_tables(SMALL, Checkpoint(checkpoint), "host", plans=plans, progress=False)
    return [Table(shard, plan.table_rows) for shard, plan in zip(shards, plans, strict=True)]


def test_every_table_of_a_file_rewritten_in_place_serves_it_as_it_now_is(tmp_path: Path, read_path: str) -> None:
    """Two tables of one file, each with a RAM tier: after a rewrite in place, the first looked up lets
    its rows go, and so does the second (each table keeps its own stamp of the file, not the mapping)."""
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(SMALL, checkpoint, seed=7)
    tables = both_tables(checkpoint)
    assert tables[0].shard.files == tables[1].shard.files  # one mapping of the one file
    ids = [zipf_ids(torch.Generator().manual_seed(3), t.table_rows, 2048).view(256, 8) for t in tables]
    for table, asked in zip(tables, ids, strict=True):
        rows = table.table_rows
        assert table.keep_hot(
            400 * table.shard.format.row_bytes + state_bytes(400, rows, 0, "online", True), "cpu", "ram"
        )
        reads_as_told(table, read_path)
        for _ in range(3):
            table.lookup(asked)
        assert table.tier is not None and table.tier.admission.used > 0
    rewrite_in_place(checkpoint, seed=8)
    fresh = loaded_tables(checkpoint)
    for table, oracle, asked in zip(tables, fresh, ids, strict=True):
        assert same_bits(table.lookup(asked), oracle.lookup(asked)), table.name
    for table in [*tables, *fresh]:
        table.release()


def test_a_tier_that_keeps_block_scales_reads_them_again_after_a_rewrite(tmp_path: Path, read_path: str) -> None:
    """A RAM tier that keeps its file's block scales in private memory: after a rewrite in place, the new
    weights are served with the new scales, hits and misses alike."""
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(SMALL, checkpoint, seed=7)
    table, _, rows = file_tables(checkpoint)
    in_file = table.shard.scale
    assert in_file is not None
    assert table.keep_hot(4 * in_file.numel() * in_file.element_size(), "cpu", "ram")
    assert table.shard.scale is not in_file  # kept privately
    reads_as_told(table, read_path)
    ids = zipf_ids(torch.Generator().manual_seed(3), rows, 4096).view(512, 8)
    for _ in range(3):
        table.lookup(ids)
    rewrite_in_place(checkpoint, seed=8)
    fresh = file_tables(checkpoint)[1]
    for _ in range(2):
        assert same_bits(table.lookup(ids), fresh.lookup(ids))
        assert torch.equal(table.lookup(ids, output=PACKED), fresh.lookup(ids, output=PACKED))
    table.release()
    fresh.release()


# Maps argv[1] writable and shared, says so, then for each line "<offset> <hex bytes>" on stdin writes the
# bytes there through the mapping and says "done"; ends when stdin closes.
MAP_WRITER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
mapped = mmap.mmap(fd, 0, mmap.MAP_SHARED)
os.close(fd)
print("mapped", flush=True)
for line in sys.stdin:
    offset, data = line.split()
    mapped[int(offset) : int(offset) + len(bytes.fromhex(data))] = bytes.fromhex(data)
    print("done", flush=True)
"""


@pytest.mark.parametrize("tier", ["ram", "device"])
def test_writes_through_another_processs_mapping_never_leave_a_tier_serving_old_rows(
    tmp_path: Path, shm_tmp: Path, tier: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A process in another pid namespace (a container beside the engine: its pid means nothing here)
    maps the file writable and shared and writes rows through it, again and again: once a page is dirty
    its later writes change no time, so only the writer's presence can say the tier's copies are stale.
    While it has the file mapped, every lookup's rows are the file's as it then is (said once); once it
    is gone, the tier holds rows again."""
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")  # no read past the page cache writes the dirty pages back
    checkpoint = (tmp_path if tier == "ram" else shm_tmp) / "ckpt"
    table, ids = tiered_file_table(checkpoint, tier, "page cache")
    hot = int(ids.flatten()[0])
    mapping = table.shard.files[0]
    row_width = table.shard.format.row_format.weight_width(SMALL.head_dim)
    offset = table.shard.weight.data_ptr() - mapping.addr + (hot - table.shard.row_start) * row_width
    command = [sys.executable, "-c", MAP_WRITER, str(checkpoint / "model.safetensors")]
    namespaced = ["unshare", "--pid", "--fork", "--mount-proc", *command]
    writer = subprocess.Popen(
        namespaced, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    with writer, caplog.at_level(logging.INFO, logger="engram"):
        assert writer.stdin is not None and writer.stdout is not None
        if writer.stdout.readline().strip() != "mapped":
            pytest.skip(f"cannot make a pid namespace here: {writer.communicate(timeout=60)[1].strip()}")
        for value in range(3):  # the first write dirties the page (and may change its time); the rest do not
            writer.stdin.write(f"{offset} {(bytes([0x30 + value]) * row_width).hex()}\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"
            oracle = file_tables(checkpoint)[1]
            assert same_bits(table.lookup(ids), oracle.lookup(ids)), value
            oracle.release()
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
        assert table.tier is not None
        hits = table.tier.stats().hits
        for _ in range(3):
            table.lookup(ids)
            table.refresh()
        oracle = file_tables(checkpoint)[1]
        assert same_bits(table.lookup(ids), oracle.lookup(ids))
        oracle.release()
        assert table.tier.stats().hits > hits  # the tier serves again
    said = [r.getMessage() for r in caplog.records if "open for writing" in r.getMessage()]
    assert said == [
        f"engram: {checkpoint / 'model.safetensors'} is open for writing by another process: {table.name}'s tier "
        "keeps no row from one lookup to the next while it is (each lookup reads its rows from the file)"
    ]
    table.release()


def test_a_file_system_that_refuses_o_direct_is_said_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the checkpoint's file system refuses O_DIRECT, the RAM tier reads its misses through the page
    cache, rows bit-equal, and says so once, naming the file and why."""
    checkpoint = tmp_path / "ckpt"
    write_checkpoint(SMALL, checkpoint, seed=7)
    real = filemap_module.fcntl.fcntl

    def refusing(fd: int, command: int, arg: int = 0) -> int:
        if command == filemap_module.fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        return real(fd, command, arg)

    monkeypatch.setattr(filemap_module.fcntl, "fcntl", refusing)
    monkeypatch.delenv("ENGRAM_DIRECT_READS", raising=False)
    with caplog.at_level(logging.WARNING, logger="engram"):
        table, plain, rows = file_tables(checkpoint)
        for _ in range(2):
            assert table.keep_hot(
                200 * table.shard.format.row_bytes + state_bytes(200, rows, 0, "online", True), "cpu", "ram"
            )
            assert table.tier is not None and not table.tier.direct
        ids = zipf_ids(torch.Generator().manual_seed(4), rows, 512)
        assert same_bits(table.lookup(ids), plain.lookup(ids))
    assert [r.getMessage() for r in caplog.records] == [
        f"engram: {checkpoint / 'model.safetensors'} is read through the page cache, not past it: its file system refuses O_DIRECT"
    ]
    table.release()
    plain.release()


def test_a_lookup_that_io_uring_fails_reads_through_the_page_cache(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Once io_uring cannot set up a ring (the descriptor limit reached after start), a lookup's misses
    are read through the page cache, bit-equal, with one warning naming the errno; once it can again,
    the tier reads past the page cache again."""
    table, plain, rows, tier = direct_tier(small_checkpoint, monkeypatch)
    generator = torch.Generator().manual_seed(9)
    ids = zipf_ids(generator, rows, 512)
    assert same_bits(table.lookup(ids), plain.lookup(ids))
    monkeypatch.setattr(direct_reads, "DIRECT_DEPTH", direct_reads.DIRECT_DEPTH // 2)  # a new ring is due
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    refused = zipf_ids(generator, rows, 512, shift=777)
    with caplog.at_level(logging.WARNING, logger="engram"):
        resource.setrlimit(resource.RLIMIT_NOFILE, (3, hard))  # no new descriptor: the old ring's number is above
        try:
            got = table.lookup(refused)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert same_bits(got, plain.lookup(refused))
    said = [r.getMessage() for r in caplog.records]
    assert (
        len(said) == 1
        and said[0].startswith("engram: ")
        and said[0].endswith(
            f"io_uring could not read {table.name}'s rows past the page cache (EMFILE: Too many open files); "
            "the lookups it fails read them through the page cache"
        )
    ), said
    assert tier.direct and tier.admission.used == 300
    before = tier.stats().admissions
    again = zipf_ids(generator, rows, 512, shift=1500)
    assert same_bits(table.lookup(again), plain.lookup(again)) and tier.stats().admissions > before
    table.release()
    plain.release()


def test_a_ram_tier_reads_only_its_misses_from_the_file(small_checkpoint: Path, read_path: str) -> None:
    """With the file's page cache dropped, a lookup of rows the tier holds brings in no page, and a lookup
    of rows it does not hold reads theirs alone, counted in disk_bytes_read: through the page cache, what
    mincore then sees resident (within 1%); past it, the bytes of their direct reads (the rule's model)
    with no page of the file cached."""
    table, plain, rows = file_tables(small_checkpoint)
    budget = 600 * table.shard.format.row_bytes + state_bytes(600, rows, 0, "online", eager=True)
    assert table.keep_hot(budget, "cpu", "ram") == 600
    tier = reads_as_told(table, read_path)
    for _ in range(4):
        ids = zipf_ids(torch.Generator().manual_seed(9), rows, 1024).view(128, 8)
        table.lookup(ids)
    drop_pages(table)
    held = tier.admission.held_rows()[:500].view(50, 10)
    assert same_bits(table.lookup(held), plain.lookup(held))
    assert resident_bytes(table.shard.files) == 0  # all hits: not a page of the file was read
    misses = [r for r in range(rows) if r not in set(tier.admission.held_rows().tolist())][:8]
    read_before = table.stats().disk_bytes_read
    assert same_bits(table.lookup(torch.tensor([misses])), plain.lookup(torch.tensor([misses])))
    read = table.stats().disk_bytes_read - read_before  # /proc/self/io
    if tier.direct:
        expected = 0
        for part in (table.shard.weight, table.shard.scale):
            assert part is not None and in_files(table.shard, part)
            row_bytes, file = part.shape[1] * part.element_size(), table.shard.files[0]
            local = [r - table.row_start for r in misses]
            expected += direct_ranges(
                file.size, part.data_ptr() - file.addr, row_bytes, local, DIRECT_GAP, DIRECT_MAX_RANGE
            )[1]
        assert read == expected and resident_bytes(table.shard.files) == 0
    else:
        resident = resident_bytes(table.shard.files)
        assert resident > 0 and abs(read - resident) <= 0.01 * resident, read
    table.release()
    plain.release()


def test_a_ram_tier_keeps_the_block_scales_that_fit_a_quarter_of_it(small_checkpoint: Path, read_path: str) -> None:
    """Block scales taking more than a quarter of a RAM tier's budget stay the file's; at a quarter they
    are read into private memory, bit-equal to the file's, counted in the tier's bytes and taken from its
    rows' budget, and a miss then reads pages of its row's weight alone: rows bit-equal, as stored too."""
    table, plain, rows = file_tables(small_checkpoint)
    row_bytes, in_file = table.shard.format.row_bytes, table.shard.scale
    assert in_file is not None
    scale_bytes = in_file.numel() * in_file.element_size()
    small = 4 * scale_bytes - 1
    assert table.keep_hot(small, "cpu", "ram") == capacity_for(small, row_bytes, rows, eager=True)
    assert table.shard.scale is in_file and in_files(table.shard, in_file)
    capacity = table.keep_hot(4 * scale_bytes, "cpu", "ram")
    assert capacity == capacity_for(3 * scale_bytes, row_bytes, rows, eager=True) > 0
    private = table.shard.scale
    assert private is not None and not in_files(table.shard, private)
    assert torch.equal(private.view(torch.uint8), plain.shard.scale.view(torch.uint8))  # type: ignore[union-attr]
    tier = reads_as_told(table, read_path)
    assert (
        tier.stats().bytes == capacity * row_bytes + state_bytes(capacity, rows, 0, "online", eager=True) + scale_bytes
    )
    drop_pages(table)
    generator = torch.Generator().manual_seed(12)
    for step in range(6):
        ids = zipf_ids(generator, rows, 2048, shift=0 if step < 3 else 77).view(256, 8)
        assert same_bits(table.lookup(ids), plain.lookup(ids)), step
        assert torch.equal(table.lookup(ids, output=PACKED), plain.lookup(ids, output=PACKED)), step
    assert table.stats().disk_bytes_read > 0 and tier.stats().evictions > 0
    start = in_file.data_ptr() // PAGE * PAGE
    assert resident_pages(start, in_file.data_ptr() + scale_bytes - start).count(1) == 0  # no page of scales read
    table.release()
    plain.release()


def test_a_large_lookup_without_a_tier_reads_in_batches_bit_equal(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup of more than BATCHED_IDS ids from a file on disk reads its distinct rows in address-ordered
    batches (counted here), and every id gets the loaded table's row: repeats, DEAD_ID, and the two
    ends of the table."""
    monkeypatch.setattr(FileReader, "batch_rows", 1000)
    monkeypatch.setattr(FileReader, "batched_ids", 5000)
    table, plain, rows = file_tables(small_checkpoint)
    batches = []
    real = table.reader.gather
    monkeypatch.setattr(
        table.reader, "gather", lambda ids, kind, **kw: batches.append(ids.clone()) or real(ids, kind, **kw)
    )
    ids = torch.randint(0, rows, (2000, 4), generator=torch.Generator().manual_seed(10))
    ids[0] = torch.tensor([0, rows - 1, DEAD_ID, 0])
    assert same_bits(table.lookup(ids), plain.lookup(ids))
    distinct = torch.unique(ids)
    assert torch.equal(torch.cat(batches), distinct) and max(b.numel() for b in batches) == 1000
    assert all(int(a[-1]) < int(b[0]) for a, b in itertools.pairwise(batches))  # address order
    with pytest.raises(EngramError, match="outside the table"):
        table.lookup(torch.cat([ids.view(-1), torch.tensor([rows])]).view(-1, 1))
    table.release()
    plain.release()


def test_a_prefetch_reads_a_lookups_misses_into_the_tier_before_it(small_checkpoint: Path, read_path: str) -> None:
    """Table.prefetch of a step's ids with the file's page cache dropped: past the page cache, the rows the
    tier does not hold are admitted while the caller works, their bytes counted as their direct reads
    (the rule's model) with no page of the file cached, and the lookup that follows admits nothing more:
    every row it serves is a hit. Through the page cache, the pages of the rows not held are asked for
    (readahead_bytes). Rows bit-equal to the loaded table's either way, and for a lookup of other ids."""
    table, plain, rows = file_tables(small_checkpoint)
    budget = 600 * table.shard.format.row_bytes + state_bytes(600, rows, 0, "online", eager=True)
    assert table.keep_hot(budget, "cpu", "ram") == 600
    tier = reads_as_told(table, read_path)
    generator = torch.Generator().manual_seed(21)
    for _ in range(3):
        table.lookup(zipf_ids(generator, rows, 1024).view(128, 8))
    drop_pages(table)
    ids = zipf_ids(generator, rows, 512, shift=4321).view(64, 8)  # fewer distinct rows than slots
    held = set(tier.admission.held_rows().tolist())
    misses = sorted({int(r) for r in ids.flatten()} - held)
    assert 0 < len(misses) < 600
    read_before, admissions_before = table.stats().disk_bytes_read, tier.stats().admissions
    asked = table.prefetch(ids)
    if tier.direct:
        assert asked == len(misses) * table.shard.format.row_bytes
        assert same_bits(table.lookup(ids), plain.lookup(ids))
        stats = tier.stats()
        assert stats.admissions - admissions_before == len(misses)
        assert set(misses) <= set(tier.admission.held_rows().tolist())
        expected = 0
        for part in (table.shard.weight, table.shard.scale):
            assert part is not None
            row_bytes, file = part.shape[1] * part.element_size(), table.shard.files[0]
            local = [r - table.row_start for r in misses]
            expected += direct_ranges(
                file.size, part.data_ptr() - file.addr, row_bytes, local, DIRECT_GAP, DIRECT_MAX_RANGE
            )[1]
        assert table.stats().disk_bytes_read - read_before == expected
        assert resident_bytes(table.shard.files) == 0
    else:
        assert asked > 0 and table.stats().readahead_bytes >= asked
        assert same_bits(table.lookup(ids), plain.lookup(ids))
    none = torch.empty(0, 8, dtype=torch.int64)  # an idle replica's step: no ids, no rows, no read
    assert table.prefetch(none) == 0 and table.lookup(none).shape == (0, 8, table.shard.format.dim)
    other = zipf_ids(generator, rows, 1024, shift=999).view(128, 8)
    table.prefetch(ids)
    assert same_bits(table.lookup(other), plain.lookup(other))  # a prefetch of other ids: still exact
    again = zipf_ids(generator, rows, 512, shift=3131).view(64, 8)
    table.prefetch(again)  # then a lookup that admits by another path (ids checked with others') moves rows
    checked = zipf_ids(generator, rows, 512, shift=2718).view(64, 8)
    assert same_bits(table.lookup(checked, check=other), plain.lookup(checked))
    assert same_bits(table.lookup(again), plain.lookup(again))
    buffer = again.clone()
    table.prefetch(buffer)
    buffer.copy_(other[:64])  # a caller that reuses its ids buffer before the lookup
    assert same_bits(table.lookup(buffer), plain.lookup(other[:64]))
    check_eager_state(tier.admission)
    assert not bool((tier.admission.referenced == PINNED).any())
    table.release()
    plain.release()


# Run in a fresh interpreter with one OpenMP thread, as vLLM's workers run: a child forked after a parallel
# region of GNU OpenMP hangs in its next one, whatever engram does. Exits 0 when the forked child's lookups
# were exact (the child's alarm kills it if they wait on the parent's reads).
FORKED_MID_PREFETCH = """
import os, signal, sys, time
from pathlib import Path
import torch
from engram.runtime.tiers import ram as ram_module
from tests.bits import same_bits
from tests.runtime.tiers.test_ram_tier import direct_tier, zipf_ids, check_eager_state

class Env:
    def setenv(self, name, value):
        os.environ[name] = value

table, plain, rows, tier = direct_tier(Path(sys.argv[1]), Env())
real = ram_module.read_direct

def held_back(*args):
    time.sleep(0.5)
    return real(*args)

ram_module.read_direct = held_back
ids = zipf_ids(torch.Generator().manual_seed(5), rows, 512).view(64, 8)
expected = plain.lookup(ids)
assert table.prefetch(ids) > 0
pid = os.fork()
if pid == 0:
    code = 1
    try:
        signal.alarm(60)  # the old wait was 630 s
        code = 0 if same_bits(table.lookup(ids), expected) and same_bits(table.lookup(ids), expected) else 2
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, f"the forked child: {os.waitstatus_to_exitcode(status)}"
assert same_bits(table.lookup(ids), expected)  # the parent's own prefetch settles as ever
check_eager_state(tier.admission)
"""


def test_a_process_forked_while_a_prefetch_reads_serves_exact_rows_at_once(small_checkpoint: Path) -> None:
    """A process forked while a prefetch's reads past the page cache are in flight (held back half a
    second) inherits futures no thread of it will complete, and slots the parent's reads fill in the
    parent's memory only: its next lookup drops what the parent started and serves rows bit-equal to the
    loaded table's, without waiting for the parent's reads."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ENGRAM_DIRECT_READS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", FORKED_MID_PREFETCH, str(small_checkpoint)],
        cwd=Path(__file__).parents[3], env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if "this file system refuses O_DIRECT" in done.stderr:
        pytest.skip("this file system refuses O_DIRECT")
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_prefetch_whose_reads_fail_fails_the_lookup_after_it_and_leaves_no_row_wrong(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefetch's read past the page cache that fails (a file that shrank) is raised by the lookup that
    waits for it, with the tier holding nothing rather than rows whose bytes never came; the lookups
    after it are bit-equal. A prefetch still reading when its table is released is waited for: the
    release returns once no read writes the freed tier."""
    table, plain, rows, tier = direct_tier(small_checkpoint, monkeypatch)
    generator = torch.Generator().manual_seed(23)
    table.lookup(zipf_ids(generator, rows, 2048).view(256, 8))
    real = ram_module.read_direct

    def shrunk(*args: object) -> object:
        raise EngramError("the checkpoint shrank")

    monkeypatch.setattr(ram_module, "read_direct", shrunk)
    ids = zipf_ids(generator, rows, 2048, shift=555).view(256, 8)
    assert table.prefetch(ids) > 0  # the reads fail on the read-ahead thread: nothing is raised yet
    monkeypatch.setattr(ram_module, "read_direct", real)
    with pytest.raises(EngramError, match="shrank"):
        table.lookup(ids)
    assert tier.admission.used == 0 and not bool((tier.admission.referenced == PINNED).any())
    for _ in range(2):
        assert same_bits(table.lookup(ids), plain.lookup(ids))
        check_eager_state(tier.admission)
    done = []

    def slow(*args: object) -> object:
        time.sleep(0.3)
        got = real(*args)  # type: ignore[arg-type]
        done.append(1)
        return got

    monkeypatch.setattr(ram_module, "read_direct", slow)
    assert table.prefetch(zipf_ids(generator, rows, 2048, shift=777).view(256, 8)) > 0
    table.release()
    assert done  # the release waited for the read in flight
    plain.release()


def test_a_direct_tier_copies_misses_whose_pages_are_cached(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the file's pages are in the page cache (a file that fits in memory after all), a tier that
    reads past the page cache copies its misses from there instead: no read past it, rows bit-equal, the
    rows admitted; with the pages dropped it reads past the page cache again."""
    table, plain, rows, tier = direct_tier(small_checkpoint, monkeypatch)
    reads = []
    real = ram_module.read_direct

    def counted(*args: object) -> object:
        reads.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(ram_module, "read_direct", counted)
    for mapping in table.shard.files:
        assert mapping.path is not None
        with open(mapping.path, "rb") as f:
            while f.read(1 << 20):
                pass
    generator = torch.Generator().manual_seed(31)
    ids = zipf_ids(generator, rows, 512).view(64, 8)
    admitted = tier.stats().admissions
    assert same_bits(table.lookup(ids), plain.lookup(ids))
    assert not reads and tier.stats().admissions > admitted
    drop_pages(table)
    other = zipf_ids(generator, rows, 512, shift=4000).view(64, 8)
    assert same_bits(table.lookup(other), plain.lookup(other))
    assert reads
    table.release()
    plain.release()


def test_with_memory_to_spare_a_tier_stands_aside_and_the_page_cache_keeps_the_pages(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unless told (ENGRAM_DIRECT_READS unset), a tier serves only while the memory left would not hold its
    file twice over. With memory to spare it stands aside: a lookup reads the file's pages as without a
    tier, which stay in the page cache for the lookups after, and the tier admits nothing and counts
    nothing; once memory is short, looked at again, it serves, and the rows a lookup misses are read past
    the page cache into the tier alone (the bytes of the rule's model, no page cached); and a
    file_cache_bytes below twice the file keeps it serving whatever memory is left. Rows bit-equal
    throughout."""
    monkeypatch.delenv("ENGRAM_DIRECT_READS", raising=False)
    left = [1 << 50]
    monkeypatch.setattr(ram_module, "free_bytes_now", lambda: left[0])
    table, plain, rows = file_tables(small_checkpoint)
    assert table.keep_hot(600 * table.shard.format.row_bytes + state_bytes(600, rows, 0, "online", True), "cpu", "ram")
    tier = table.tier
    assert isinstance(tier, RamTier)
    if not tier.can_read_direct:
        pytest.skip("this file system refuses O_DIRECT")
    assert tier.aside and not tier.direct
    file = table.shard.files[0]
    parts = [p for p in (table.shard.weight, table.shard.scale) if p is not None and in_files(table.shard, p)]

    def pages_of(missed: list[int]) -> set[int]:
        """The file's pages (offsets / PAGE) that the rows `missed` lie in, from their bytes."""
        found = set()
        for part in parts:
            width, start = part.shape[1] * part.element_size(), part.data_ptr() - file.addr
            for row in missed:
                at = start + (row - table.row_start) * width
                found |= set(range(at // PAGE, (at + width - 1) // PAGE + 1))
        return found

    def cached_pages() -> set[int]:
        return {i for i, resident in enumerate(resident_pages(file.addr, file.length)) if resident}

    def not_held(count: int, skip: int) -> list[int]:
        held = set(tier.admission.held_rows().tolist())
        return [r for r in range(table.row_start, table.row_start + rows) if r not in held][skip : skip + count]

    asked: list[str] = []  # what lookups ask of the files (follow_files): nothing while the tier holds nothing
    for name in ("rewritten", "being_written"):
        real = getattr(base_module, name)
        monkeypatch.setattr(base_module, name, lambda shard, real=real, name=name: asked.append(name) or real(shard))
    drop_pages(table)
    missed = not_held(8, 0)
    assert same_bits(table.lookup(torch.tensor([missed])), plain.lookup(torch.tensor([missed])))
    assert pages_of(missed) <= cached_pages()  # they stay for the next lookups
    assert tier.admission.used == 0 and tier.stats().lookups == 0  # the tier stood aside
    assert asked == []
    left[0] = 0  # memory runs short: the next look at it, after SPARE_EVERY_S, reads past the page cache
    monkeypatch.setattr(ram_module, "SPARE_EVERY_S", 0.0)
    drop_pages(table)
    missed = not_held(8, 100)
    read_before = table.stats().disk_bytes_read
    assert same_bits(table.lookup(torch.tensor([missed])), plain.lookup(torch.tensor([missed])))
    assert tier.direct and not tier.aside and not cached_pages()
    assert set(missed) <= set(tier.admission.held_rows().tolist())
    assert asked == ["rewritten", "being_written"]  # serving, its rows can go stale: the files are asked
    expected = sum(
        direct_ranges(
            file.size, part.data_ptr() - file.addr, part.shape[1] * part.element_size(),
            [r - table.row_start for r in missed], DIRECT_GAP, DIRECT_MAX_RANGE,
        )[1]
        for part in parts
    )  # fmt: skip
    assert table.stats().disk_bytes_read - read_before == expected
    left[0] = 1 << 50
    bounded = RamTierReader(table.shard, rows, tier, DiskReads(True), ResidentBudget(2 * file.size - 1))
    assert tier.page_cache_bound == 2 * file.size - 1 and tier.direct  # the page cache may not keep it twice
    bounded = RamTierReader(table.shard, rows, tier, DiskReads(True), ResidentBudget(2 * file.size))
    assert not tier.direct and tier.aside
    del bounded
    table.release()
    plain.release()


def test_a_tier_told_to_serve_when_it_is_made_serves_with_memory_to_spare(
    small_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENGRAM_DIRECT_READS is read when the tier is made, as the mapping reads it: a tier made while it is
    set serves (and reads as told) at every look at the memory left, whatever is left and whatever the
    variable says later; one made while it is unset stands aside with memory to spare."""
    monkeypatch.setattr(ram_module, "free_bytes_now", lambda: 1 << 50)
    monkeypatch.setattr(ram_module, "SPARE_EVERY_S", 0.0)  # every lookup looks again
    monkeypatch.setenv("ENGRAM_DIRECT_READS", "0")
    table, plain, rows = file_tables(small_checkpoint)
    budget = 600 * table.shard.format.row_bytes + state_bytes(600, rows, 0, "online", True)
    assert table.keep_hot(budget, "cpu", "ram")
    told = table.tier
    assert isinstance(told, RamTier)
    monkeypatch.delenv("ENGRAM_DIRECT_READS")
    ids = torch.arange(table.row_start, table.row_start + 64).view(8, 8)
    for _ in range(2):
        assert same_bits(table.lookup(ids), plain.lookup(ids))
    assert not told.aside and not told.direct and told.stats().lookups == 128
    again, loaded, _ = file_tables(small_checkpoint)
    assert again.keep_hot(budget, "cpu", "ram")
    assert isinstance(again.tier, RamTier) and again.tier.aside
    for each in (table, plain, again, loaded):
        each.release()
