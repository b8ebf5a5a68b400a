"""The CUDA kernels run on the CPU (tests/emulated/library.py), called through the same C ABI wrapper as
on a GPU (engram.ops.cuda.gather_cuda), against the CPU twins and engram.ops.reference, bit for bit. Every
load and store is checked by AddressSanitizer against the exact allocations the caller made, so a read
one byte past a table fails here. The RAM tier's index (kernels/cpu/tier_cpu.c) runs here too, built
under the sanitizer, against a dict and CLOCK one slot at a time, and its reads past the page cache
(direct_cpu.c) against the file's bytes. Run by tests/test_emulated_kernels.py in a
process with the sanitizer's runtime preloaded; not collected on its own."""

from __future__ import annotations

import ctypes
import os
import random
import tempfile

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.ops import DEAD_ID, SCALE_DTYPE, cpu, gather, gather_reference, kernel_ids, ngram_hash_reference
from engram.ops.cuda import gather_cuda
from engram.runtime.tiers.clock import CLEAR, PINNED, SET
from engram.runtime.tiers.row_index import EMPTY, FREE, buckets_for
from tests.bits import same_bytes
from tests.emulated.library import emulated, sanitized_tier
from tests.runtime.placement.reference import direct_ranges

GEN = torch.Generator().manual_seed(33)
SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 63, 64, 65, 127, 128, 129, 257]


def exact(nbytes: int, offset: int = 0) -> torch.Tensor:
    """nbytes of random bytes that end exactly where their allocation ends (at `offset` into it, for a
    base that is not 16-byte aligned): any byte read past them is an out-of-bounds read."""
    raw = torch.randint(0, 256, (offset + nbytes,), dtype=torch.uint8, generator=GEN)
    return raw[offset:]


def table(
    fmt: str, rows: int, dim: int, offset: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None, float | None, torch.dtype]:
    """(weight, scale, table_scale, out dtype) of a random table in `fmt`; NaN bytes kept out of fp8 so
    that every output bit is comparable."""
    if fmt == "raw":
        return exact(rows * dim, offset).view(rows, dim), None, None, torch.uint8
    if fmt == "bf16":
        weight = exact(rows * dim * 2, offset).view(torch.int16).view(rows, dim)
        return weight.view(torch.bfloat16), None, None, torch.bfloat16
    codes = exact(rows * dim, offset)
    codes[(codes & 0x7F) == 0x7F] = 0x11  # no e4m3 NaN
    if fmt == "fp8-block32":
        scale = torch.randint(110, 140, (rows, dim // 32), dtype=torch.uint8, generator=GEN).view(SCALE_DTYPE)
        return codes.view(rows, dim).view(torch.float8_e4m3fn), scale, None, torch.bfloat16
    if fmt == "fp8-table":
        return codes.view(rows, dim).view(torch.float8_e4m3fn), None, 0.0123456789, torch.float32
    assert fmt == "nvfp4"
    scale = torch.randint(0x20, 0x50, (rows, dim // 16), dtype=torch.uint8, generator=GEN).view(torch.float8_e4m3fn)
    return codes[: rows * dim // 2].view(rows, dim // 2), scale, 0.75, torch.bfloat16


def expected(weight: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor, row_start: int, table_rows: int,
             out_dtype: torch.dtype, table_scale: float | None) -> tuple[torch.Tensor, int]:  # fmt: skip
    """The CPU twin's rows for `ids` with the ids outside the table read as zeros, and whether the flag
    must rise; the twin is checked against plain torch on the way."""
    bad = (ids < DEAD_ID) | (ids >= table_rows)
    clean = torch.where(bad, DEAD_ID, ids)
    twin = gather(weight, scale, clean, row_start, table_rows, out_dtype, False, None, table_scale)
    torch_rows = gather_reference(weight, scale, clean, row_start, table_rows, out_dtype, table_scale=table_scale)
    assert same_bytes(twin, torch_rows)
    return twin, int(bad.any())


def run(weight: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor, row_start: int, table_rows: int,
        out_dtype: torch.dtype, table_scale: float | None, *, sorted_form: bool = False, max_blocks: int = 0,
        order: torch.Tensor | None = None, leader: torch.Tensor | None = None,
        out_offset: int = 0) -> tuple[torch.Tensor, int]:  # fmt: skip
    """The emulated kernel through gather_cuda: its output (poisoned first: every element must be
    written) and its flag."""
    dim = weight.shape[1] * (2 if table_scale is not None and weight.dtype == torch.uint8 else 1)
    width = dim * torch.empty((), dtype=out_dtype).element_size()
    out = exact(ids.numel() * width, out_offset).fill_(0xA5).view(torch.uint8).view(-1)
    out = out.view(out_dtype).view(ids.numel(), dim) if width % out.element_size() == 0 else out
    flat, sorted_order, sorted_leader = kernel_ids(ids, sorted_form)
    if order is not None:
        sorted_order, sorted_leader = order, leader
    flag = torch.zeros(1, dtype=torch.int32)
    gather_cuda(emulated(), weight, scale, flat, sorted_order, sorted_leader, row_start, table_rows, out, flag,
                max_blocks, table_scale, stream=0)  # fmt: skip
    return out, int(flag[0])


FORMATS = [("raw", 48), ("raw", 64), ("raw", 200), ("raw", 512), ("bf16", 40), ("bf16", 64), ("bf16", 160),
           ("fp8-block32", 64), ("fp8-block32", 512), ("fp8-table", 80), ("fp8-table", 256),
           ("nvfp4", 96), ("nvfp4", 256)]  # fmt: skip


@pytest.mark.parametrize(("fmt", "dim"), FORMATS)
@pytest.mark.parametrize("offset", [0, 8])
@pytest.mark.parametrize("sorted_form", [False, True])
def test_every_format_equals_the_cpu_twin(fmt: str, dim: int, offset: int, sorted_form: bool) -> None:
    """DEAD_ID, rows of other shards, runs of equal ids, and one id past the table (zeros, and the flag)."""
    rows, row_start, table_rows = 37, 11, 60
    weight, scale, table_scale, out_dtype = table(fmt, rows, dim, offset)
    ids = torch.tensor([11, 12, DEAD_ID, 47, 48, 0, 59, 11, 11, 30, 47, 5, 60, 12, 12, 12, 40], dtype=torch.int64)
    want, raised = expected(weight, scale, ids, row_start, table_rows, out_dtype, table_scale)
    got, flag = run(weight, scale, ids, row_start, table_rows, out_dtype, table_scale, sorted_form=sorted_form)
    assert same_bytes(got, want) and (flag, raised) == (1, 1)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("max_blocks", [0, 1, 2, 3])
@pytest.mark.parametrize(("fmt", "dim"), [("raw", 64), ("raw", 300), ("fp8-block32", 256), ("nvfp4", 64)])
def test_sizes_around_every_unroll_and_capped_grids(n: int, max_blocks: int, fmt: str, dim: int) -> None:
    rows = 50
    weight, scale, table_scale, out_dtype = table(fmt, rows, dim)
    ids = torch.randint(-1, rows, (n,), dtype=torch.int64, generator=GEN)
    want, _ = expected(weight, scale, ids, 0, rows, out_dtype, table_scale)
    for sorted_form in (False, True):
        got, flag = run(
            weight, scale, ids, 0, rows, out_dtype, table_scale, sorted_form=sorted_form, max_blocks=max_blocks
        )
        assert same_bytes(got, want) and flag == 0


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(0, 40), row_bytes=st.integers(1, 700), n=st.integers(0, 300), start=st.integers(0, 20),
    offset=st.sampled_from([0, 1, 8]), out_offset=st.sampled_from([0, 1, 8]), sorted_form=st.booleans(),
    max_blocks=st.integers(0, 4), seed=st.integers(0, 2**31),
)  # fmt: skip
def test_raw_rows_of_any_shape(rows: int, row_bytes: int, n: int, start: int, offset: int, out_offset: int,
                               sorted_form: bool, max_blocks: int, seed: int) -> None:  # fmt: skip
    weight = exact(rows * row_bytes, offset).view(rows, row_bytes)
    table_rows = start + rows + 3
    ids = torch.randint(-3, table_rows + 3, (n,), dtype=torch.int64, generator=torch.Generator().manual_seed(seed))
    want, raised = expected(weight, None, ids, start, table_rows, torch.uint8, None)
    got, flag = run(weight, None, ids, start, table_rows, torch.uint8, None, sorted_form=sorted_form,
                    max_blocks=max_blocks, out_offset=out_offset)  # fmt: skip
    assert same_bytes(got.view(n, row_bytes), want) and flag == raised


# The raw gather gives a row to a sub-warp of LANES threads (8 up to 128 bytes, 16 up to 256, 32 above):
# 16 bytes a lane a pass where the row and the output are 16-byte aligned (the vector path), else one byte
# a lane a pass. Row sizes just below, at and above every pass boundary of every LANES, on both paths: a
# loop that skipped or repeated a pass would show there.
VECTOR_PASSES = {8: [128], 16: [256], 32: [512, 1024, 1536, 2048]}  # LANES x 16 bytes a pass, within its rows
BYTE_PASSES = {8: [8, 16, 120, 128], 16: [144, 160, 256], 32: [288, 320, 512, 1024]}  # LANES bytes a pass
PASS_BOUNDARIES = sorted(
    {edge + d for edges in VECTOR_PASSES.values() for edge in edges for d in (-16, 0, 16)}
    | {edge + d for edges in BYTE_PASSES.values() for edge in edges for d in (-1, 0, 1)}
)


@pytest.mark.parametrize("row_bytes", PASS_BOUNDARIES)
def test_raw_rows_at_every_pass_boundary_on_both_paths(row_bytes: int) -> None:
    for offset in (0, 1):  # 0: the vector path where row_bytes is a multiple of 16; 1: the byte path
        weight = exact(9 * row_bytes, offset).view(9, row_bytes)
        ids = torch.tensor([3, 0, 8, DEAD_ID, 5, 3, 11, 1, 7, 2, 6, 4], dtype=torch.int64)
        want, raised = expected(weight, None, ids, 2, 12, torch.uint8, None)
        got, flag = run(weight, None, ids, 2, 12, torch.uint8, None)
        assert same_bytes(got.view(ids.numel(), row_bytes), want) and flag == raised == 0


@pytest.mark.parametrize("broken", ["order past n", "negative order", "leader ahead", "leader not a leader"])
def test_a_broken_sorted_contract_raises_the_flag_and_stays_in_bounds(broken: str) -> None:
    weight, _, _, _ = table("raw", 20, 64)
    ids = torch.tensor([3, 3, 5, 7, 7, 7, 9, 11], dtype=torch.int64)
    order = torch.arange(8, dtype=torch.int64)
    leader = torch.tensor([0, 0, 2, 3, 3, 3, 6, 7], dtype=torch.int64)
    bad = 4
    if broken == "order past n":
        order[bad] = 8
    elif broken == "negative order":
        order[bad] = -5
    elif broken == "leader ahead":
        leader[bad] = 6
    else:
        leader[bad] = 1  # position 1 is itself a follower
    got, flag = run(weight, None, ids, 0, 20, torch.uint8, None, order=order, leader=leader)
    assert flag == 1
    intact = [i for i in range(8) if i != bad and order[i] == i]
    assert torch.equal(got[intact], weight[ids[intact]])  # every other row as the contract says


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 64 * 256 + 1, 70_000])
def test_check_ids_flags_exactly_the_ids_outside(n: int) -> None:
    library = emulated()
    for bad_at in (None, 0, n - 1):
        ids = torch.randint(0, 100, (n,), dtype=torch.int64, generator=GEN)
        if bad_at is not None and n:
            ids[bad_at] = 100 if bad_at else -1
        flag = torch.zeros(1, dtype=torch.int32)
        status = library.engram_check_ids_cuda(ids.data_ptr() or None, n, 0, 100, flag.data_ptr(), 0)
        assert status == 0 and int(flag[0]) == int(bad_at is not None and n > 0)


def hash_inputs(tokens: int, context: int, layers: int, max_ngram: int, heads: int) -> dict[str, torch.Tensor]:
    columns = (max_ngram - 1) * heads
    g = torch.Generator().manual_seed(tokens * 1000 + context)
    ext = exact((context + tokens) * 8).view(torch.int64).random_(0, 1 << 20, generator=g)
    start = torch.zeros(tokens, dtype=torch.int64)
    for t in range(tokens):  # dead spans and request starts: each token's lowest readable index
        position = context + t
        start[t] = position - int(torch.randint(0, max_ngram + 1, (1,), generator=g)) if t % 5 else 0
        start[t] = max(0, int(start[t]))
    primes = torch.randint(1000, 1 << 30, (layers, columns), dtype=torch.int64, generator=g)
    magic = torch.tensor([((1 << 64) - 1) // int(p) - (1 << 64) if ((1 << 64) - 1) // int(p) >= 1 << 63
                          else ((1 << 64) - 1) // int(p) for p in primes.flatten()], dtype=torch.int64).view(layers, columns)  # fmt: skip
    return {
        "ext": ext, "start": start, "multipliers": torch.randint(1, 1 << 20, (layers, max_ngram), dtype=torch.int64, generator=g) | 1,
        "primes": primes, "magic": magic, "offsets": torch.randint(0, 1 << 20, (layers, columns), dtype=torch.int64, generator=g),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("tokens", "context", "layers", "max_ngram", "heads"),
    [(0, 3, 2, 3, 4), (1, 0, 1, 2, 1), (37, 5, 2, 3, 4), (255, 2, 1, 3, 8), (256, 0, 1, 2, 1), (257, 7, 3, 4, 2), (600, 3, 2, 3, 4)],
)  # fmt: skip
def test_ngram_hash_equals_the_reference_and_the_cpu_twin(
    tokens: int, context: int, layers: int, max_ngram: int, heads: int
) -> None:
    x = hash_inputs(tokens, context, layers, max_ngram, heads)
    columns = (max_ngram - 1) * heads
    fill = 2
    want = torch.zeros(tokens, layers, columns, dtype=torch.int64)
    ngram_hash_reference(x["ext"], x["start"], x["multipliers"], x["primes"], x["offsets"], fill, want)
    outputs = {}
    for name, library in (("emulated", emulated()), ("twin", cpu.cpu_library())):
        out = exact(tokens * layers * columns * 8).view(torch.int64).fill_(-7)
        address = (lambda t: t.data_ptr() or None) if name == "emulated" else cpu.ptr
        tensors = [x["ext"], x["start"], x["multipliers"], x["primes"], x["magic"], x["offsets"], out]
        ext, start, multipliers, primes, magic, offsets, target = map(address, tensors)
        args = [
            ext,
            start,
            tokens,
            context,
            multipliers,
            primes,
            magic,
            offsets,
            layers,
            max_ngram,
            heads,
            fill,
            target,
        ]
        if name == "emulated":
            status = library.engram_ngram_hash_cuda(*args, None)
        else:
            status = library.engram_ngram_hash_cpu(*args, 1)
        assert status == 0
        outputs[name] = out.view(tokens, layers, columns)
    assert torch.equal(outputs["emulated"], want) and torch.equal(outputs["twin"], want)


def test_a_refused_launch_is_a_cuda_error_with_its_text() -> None:
    """Configuration errors reach the caller as the GPU reports them: a launch status, its code and text."""
    library = emulated()
    weight, _, _, _ = table("raw", 4, 16)
    ids = torch.zeros(1, dtype=torch.int64)
    flag = torch.zeros(1, dtype=torch.int32)
    out = torch.zeros(1, 16, dtype=torch.uint8)
    status = library.engram_gather_cuda(weight.data_ptr(), None, 4, 16, 16, 0, 4, ids.data_ptr(), None, None, 1,
                                        out.data_ptr(), 0, 0, 1.0, flag.data_ptr(), -1, None)  # fmt: skip
    assert status == 1  # a negative cap is refused before any launch
    assert library.engram_cuda_get_last_error() == 0


def emulated_hash(x: dict[str, torch.Tensor], context: int, fill: int) -> torch.Tensor:
    layers, max_ngram = x["multipliers"].shape
    columns = x["primes"].shape[1]
    tokens = x["start"].numel()
    out = exact(tokens * layers * columns * 8).view(torch.int64)
    tensors = [x["ext"], x["start"], x["multipliers"], x["primes"], x["magic"], x["offsets"]]
    ext, start, multipliers, primes, magic, offsets = (t.data_ptr() or None for t in tensors)
    status = emulated().engram_ngram_hash_cuda(ext, start, tokens, context, multipliers, primes, magic, offsets,
                                               layers, max_ngram, columns // (max_ngram - 1), fill, out.data_ptr() or None, None)  # fmt: skip
    assert status == 0
    return out.view(tokens, layers, columns)


@pytest.mark.parametrize("cut", [1, 2, 255, 256, 257, 299])
def test_ngram_hash_in_two_chunks_equals_the_whole_stream(cut: int) -> None:
    """The second chunk carries the first's last ids as context; its start indices shift with it."""
    whole = hash_inputs(300, 0, 2, 4, 3)
    context = min(cut, 3)  # max_ngram - 1 ids of history
    second = {
        **whole,
        "ext": whole["ext"][cut - context :].clone(),
        "start": (whole["start"][cut:] - (cut - context)).clamp(min=0),
    }
    assert torch.equal(emulated_hash(second, context, 2), emulated_hash(whole, 0, 2)[cut:])


def exact_i64(values: list[int]) -> torch.Tensor:
    """int64 values that end exactly where their allocation ends."""
    out = exact(8 * len(values)).view(torch.int64)
    out.copy_(torch.tensor(values, dtype=torch.int64))
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),
    st.lists(st.tuples(st.booleans(), st.lists(st.integers(-3, 103), max_size=40)), min_size=1, max_size=16),
)
def test_the_ram_tiers_index_answers_as_a_dict_inside_its_arrays(
    capacity: int, steps: list[tuple[bool, list[int]]]
) -> None:
    """kernels/cpu/tier_cpu.c under AddressSanitizer, every array exactly as long as the call says: inserts
    and removes of a shard's rows [1000, 1100) (probes that collide and wrap), finds of them, of rows on
    both sides of the shard and of ids at int64's ends (whose distance to the shard overflows), against a dict."""
    library = sanitized_tier()
    start, rows = 1000, 100
    buckets = buckets_for(capacity)
    table = exact_i64([EMPTY] * buckets)
    shape = (buckets, start, rows, capacity)
    held: dict[int, int] = {}
    free = list(range(capacity))
    for add, batch in steps:
        distinct = [start + r for r in dict.fromkeys(batch) if 0 <= r < rows]
        if add:
            new = [r for r in distinct if r not in held][: len(free)]
            slots = [free.pop() for _ in new]
            rows_in, slots_in = exact_i64(new), exact_i64(slots)  # alive through the call: ctypes keeps no reference
            status = library.engram_tier_insert(cpu.ptr(table), *shape, cpu.ptr(rows_in), cpu.ptr(slots_in), len(new))
            held.update(zip(new, slots, strict=True))
        else:
            gone = [r for r in distinct if r in held]
            rows_in = exact_i64(gone)
            status = library.engram_tier_remove(cpu.ptr(table), *shape, cpu.ptr(rows_in), len(gone))
            free += [held.pop(r) for r in gone]
        assert status == 0
        queries = [*range(start - 3, start + rows + 3), DEAD_ID, -(2**63), -(2**63) + start - 1, 2**63 - 1]
        asked, slots_out = exact_i64(queries), exact_i64([7] * len(queries))
        status = library.engram_tier_find(cpu.ptr(table), *shape, cpu.ptr(asked), len(queries), cpu.ptr(slots_out))
        assert status == 0 and slots_out.tolist() == [held.get(q, FREE) for q in queries]
    full = exact_i64([(r << 32) | r for r in range(capacity + 1)])  # no empty bucket: refused, not probed forever
    absent, slot = exact_i64([start + rows - 1]), exact_i64([0])
    status = library.engram_tier_find(
        cpu.ptr(full), capacity + 1, start, rows, capacity, cpu.ptr(absent), 1, cpu.ptr(slot)
    )
    assert status == 1


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=40), st.data())
def test_the_clock_sweep_stays_inside_its_arrays_and_is_clock(states: list[int], data: st.DataObject) -> None:
    """engram_clock_sweep under AddressSanitizer from any state (set, clear, pinned bits and bytes that
    are none of them), hand and count, against CLOCK one slot at a time: the same victims, bits and hand,
    or, when too few slots are unpinned, an error with none taken."""
    library = sanitized_tier()
    capacity = len(states)
    hand, count = data.draw(st.integers(0, capacity - 1)), data.draw(st.integers(0, capacity))
    state = exact(capacity)
    state.copy_(torch.tensor(states, dtype=torch.uint8))
    victims = exact_i64([-5] * count)
    at = ctypes.c_int64(hand)
    status = library.engram_clock_sweep(state.data_ptr(), capacity, ctypes.byref(at), count, cpu.ptr(victims))
    want, taken, moving = list(states), [], hand
    for _ in range(2 * capacity):
        if len(taken) == count:
            break
        slot, moving = moving, (moving + 1) % capacity
        if want[slot] == CLEAR:
            want[slot] = PINNED
            taken.append(slot)
        elif want[slot] == SET:
            want[slot] = CLEAR
    if len(taken) < count:
        assert status == 1 and at.value == hand
        want = [CLEAR if slot in taken else s for slot, s in enumerate(want)]
    else:
        assert status == 0 and victims.tolist() == taken and at.value == moving
    assert state.tolist() == want


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([1, 8, 264, 4096, 5000]),
    st.integers(0, 5000),
    st.sets(st.integers(0, 199), max_size=60),
    st.integers(1, 9),
    st.sampled_from([0, 4096]),
    st.sampled_from([4096, 12288]),
    st.randoms(use_true_random=False),
)
def test_direct_reads_stay_inside_their_arrays_and_read_the_files_bytes(
    row_bytes: int, offset: int, rows: set[int], depth: int, gap: int, most: int, shuffle: random.Random
) -> None:
    """engram_read_direct_cpu under AddressSanitizer: rows, slots and the destination exactly as long as
    the call says, any row size, offset, coalescing and depth; each row's bytes land in its slot alone,
    equal to the file's, in the reads the rule's model counts."""
    library = sanitized_tier()
    shard_rows = 200
    data = random.Random(row_bytes * 7 + offset).randbytes(offset + shard_rows * row_bytes)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "rows.bin")
        with open(path, "wb") as f:
            f.write(data)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError:
            pytest.skip("this file system refuses O_DIRECT")
        try:
            wanted = sorted(rows)
            slots = list(range(len(wanted)))
            shuffle.shuffle(slots)
            dst = exact(len(wanted) * row_bytes)
            asked, where = exact_i64(wanted), exact_i64(slots)
            ranges, nbytes, error = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
            status = library.engram_read_direct_cpu(
                (ctypes.c_int * 1)(fd), cpu.int64s([len(data)]), cpu.int64s([offset]), cpu.int64s([0]), 1, shard_rows,
                row_bytes, cpu.ptr(asked), cpu.ptr(where), len(wanted), dst.data_ptr(), len(wanted), gap, most, depth,
                60_000, ctypes.byref(ranges), ctypes.byref(nbytes), ctypes.byref(error),
            )  # fmt: skip
        finally:
            os.close(fd)
    assert (status, error.value) == (0, 0)
    assert (ranges.value, nbytes.value) == direct_ranges(len(data), offset, row_bytes, wanted, gap, most)
    got = dst.view(-1, row_bytes) if wanted else dst
    for row, slot in zip(wanted, slots, strict=True):
        start = offset + row * row_bytes
        assert bytes(got[slot].tolist()) == data[start : start + row_bytes]


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([8, 264, 5000]),
    st.lists(st.integers(1, 199), max_size=6, unique=True),
    st.sets(st.integers(0, 199), max_size=60),
    st.integers(1, 9),
    st.sampled_from([0, 4096]),
    st.randoms(use_true_random=False),
)
def test_direct_reads_of_pieces_in_several_files_stay_inside_their_arrays(
    row_bytes: int, cuts: list[int], rows: set[int], depth: int, gap: int, shuffle: random.Random
) -> None:
    """engram_read_direct_cpu over a shard in pieces (a table its checkpoint splits into parts), each piece
    at its own offset of one of two files: under AddressSanitizer every row's bytes land in its slot alone,
    equal to its piece's file's, and a range never joins rows of two pieces (the reads are each piece's
    own, as the one-piece rule counts them)."""
    library = sanitized_tier()
    shard_rows = 200
    starts = [0, *sorted(cuts)]
    ends = [*starts[1:], shard_rows]
    with tempfile.TemporaryDirectory() as directory:
        contents = [bytearray(random.Random(row_bytes + k).randbytes(shuffle.randrange(0, 9000))) for k in range(2)]
        placed = []  # (file, offset) of each piece, appended to its file after random padding
        for start, end in zip(starts, ends, strict=True):
            k = shuffle.randrange(2)
            contents[k] += random.Random(start).randbytes(shuffle.randrange(0, 5000))
            placed.append((k, len(contents[k])))
            contents[k] += random.Random(start * 31 + row_bytes).randbytes((end - start) * row_bytes)
        fds = []
        try:
            for k, data in enumerate(contents):
                path = os.path.join(directory, f"part{k}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                try:
                    fds.append(os.open(path, os.O_RDONLY | os.O_DIRECT))
                except OSError:
                    pytest.skip("this file system refuses O_DIRECT")
            wanted = sorted(rows)
            slots = list(range(len(wanted)))
            shuffle.shuffle(slots)
            dst = exact(len(wanted) * row_bytes)
            asked, where = exact_i64(wanted), exact_i64(slots)
            sizes, offsets = exact_i64([len(contents[k]) for k, _ in placed]), exact_i64([o for _, o in placed])
            firsts = exact_i64(starts)
            ranges, nbytes, error = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
            status = library.engram_read_direct_cpu(
                (ctypes.c_int * len(placed))(*(fds[k] for k, _ in placed)),
                cpu.ptr(sizes), cpu.ptr(offsets), cpu.ptr(firsts), len(starts), shard_rows, row_bytes, cpu.ptr(asked), cpu.ptr(where), len(wanted),
                dst.data_ptr(), len(wanted), gap, 4096, depth, 60_000, ctypes.byref(ranges), ctypes.byref(nbytes),
                ctypes.byref(error),
            )  # fmt: skip
        finally:
            for fd in fds:
                os.close(fd)
    assert (status, error.value) == (0, 0)
    expected_reads = 0
    for (k, offset), start, end in zip(placed, starts, ends, strict=True):
        mine = [row - start for row in wanted if start <= row < end]
        expected_reads += direct_ranges(len(contents[k]), offset, row_bytes, mine, gap, 4096)[0]
    assert ranges.value == expected_reads
    got = dst.view(-1, row_bytes) if wanted else dst
    for row, slot in zip(wanted, slots, strict=True):
        piece = max(j for j, s in enumerate(starts) if s <= row)
        k, offset = placed[piece]
        at = offset + (row - starts[piece]) * row_bytes
        assert bytes(got[slot].tolist()) == bytes(contents[k][at : at + row_bytes])


def driver_state(library: ctypes.CDLL) -> tuple[int, int, int]:
    """What the emulated CUDA driver holds now: (allocation handles, bytes reserved, bytes mapped)."""
    handles, reserved, mapped = ctypes.c_long(), ctypes.c_uint64(), ctypes.c_uint64()
    library.engram_emu_driver_state(ctypes.byref(handles), ctypes.byref(reserved), ctypes.byref(mapped))
    return handles.value, reserved.value, mapped.value


@pytest.mark.parametrize("size", [1, (2 << 20) - 1, 5 << 20, 9 << 20])
def test_host_numa_tables_are_all_there_or_not_at_all(size: int) -> None:
    """engram_host_numa_map over the emulated driver (kernels/emulate/cuda.h), chunks of 4 MiB: a table
    maps to padded, granular bytes the host reads and writes end to end, and unmapping leaves the driver
    holding nothing; made to fail at each of its driver calls in turn, it reports that call's step and
    leaves nothing allocated, reserved or mapped (under AddressSanitizer)."""
    library = emulated()
    library.engram_emu_driver_fail_at.argtypes = [ctypes.c_long]
    chunk = 4 << 20
    granule = 2 << 20

    def map_one() -> tuple[int, int, int, int, int, int]:
        addr, padded, grain = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        node, step = ctypes.c_int(), ctypes.c_int()
        code = library.engram_host_numa_map(
            size, chunk, -1, ctypes.byref(addr), ctypes.byref(padded), ctypes.byref(grain), ctypes.byref(node),
            ctypes.byref(step),
        )  # fmt: skip
        return code, addr.value, padded.value, grain.value, node.value, step.value

    library.engram_emu_driver_fail_at(-1)
    code, addr, padded, grain, node, step = map_one()
    assert (code, grain, node, step) == (0, granule, 0, 0)
    assert padded == -(-size // granule) * granule and driver_state(library) == (0, padded, padded)
    view = (ctypes.c_uint8 * padded).from_address(addr)
    ctypes.memset(addr, 0xA5, padded)  # every byte, across every chunk, written and read by the host
    assert view[0] == view[padded - 1] == view[padded // 2] == 0xA5
    assert library.engram_host_numa_unmap(addr, padded, chunk) == 0
    assert driver_state(library) == (0, 0, 0)
    chunks = -(-padded // chunk)
    # the driver calls in order: device, its NUMA node, the granularity, each chunk's create, the address
    # range, each chunk's map, the access: the steps they report
    steps = [2, 3, 4, *[5] * chunks, 6, *[7] * chunks, 8]
    for at, want_step in enumerate(steps):
        library.engram_emu_driver_fail_at(at)
        code, addr, _, _, _, step = map_one()
        assert code != 0 and step == want_step and addr == 0, (at, step)
        assert driver_state(library) == (0, 0, 0), at
    library.engram_emu_driver_fail_at(-1)
