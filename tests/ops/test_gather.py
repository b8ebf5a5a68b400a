"""engram::gather: fp8 dequantisation exact on every value and scale, zeros for DEAD_ID and unowned rows,
out-of-table ids refused, native twin equal to plain torch, and torch.compile."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.errors import EngramError
from engram.ops import cpu, gather, gather_into, gather_reference
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.storage import allocate
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import ShardFormat
from tests.bits import same_bits


def native_gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out_dtype: torch.dtype,
    sorted_form: bool = False,
) -> torch.Tensor:
    assert cpu.cpu_library() is not None  # the native twin, not the torch fallback
    out = torch.full((*ids.shape, weight.shape[1]), 7, dtype=out_dtype)  # poisoned: every element must be written
    gather_into(weight, scale, ids, row_start, table_rows, out, sorted_form)
    return out


def sorted_gather(*args: object) -> torch.Tensor:
    return native_gather(*args, sorted_form=True)  # type: ignore[arg-type]


PATHS = {"native": native_gather, "sorted": sorted_gather, "torch": gather_reference}


def every_fp8_and_scale() -> tuple[torch.Tensor, torch.Tensor]:
    """Row e holds all 256 fp8 bytes, with every block scaled by ue8m0 byte e: all 65,536 pairs."""
    weight = torch.arange(256, dtype=torch.uint8).repeat(256, 1).view(torch.float8_e4m3fn)
    scale = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 8).view(torch.float8_e8m0fnu)
    return weight, scale


def float64_reference(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    exponent = scale.view(torch.uint8).to(torch.float64)
    factor = torch.where(exponent == 255, torch.nan, torch.exp2(exponent - 127))
    return weight.to(torch.float64) * factor.repeat_interleave(32, dim=1)


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_dequantisation_is_exact(path: str, out_dtype: torch.dtype) -> None:
    weight, scale = every_fp8_and_scale()
    ids = torch.arange(256)
    got = PATHS[path](weight, scale, ids, 0, 256, out_dtype)
    assert got is not None
    assert same_bits(got, float64_reference(weight, scale).to(out_dtype))


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
def test_zeros_for_dead_and_unowned_rows(path: str) -> None:
    weight = torch.arange(1, 4 * 32 + 1, dtype=torch.float32).view(4, 32)
    ids = torch.tensor([[10, -1, 13], [9, 14, 11]])  # the shard holds rows 10..13 of a 20-row table
    got = PATHS[path](weight, None, ids, 10, 20, torch.float32)
    assert got is not None and got.shape == (2, 3, 32)
    assert torch.equal(got[0, 0], weight[0]) and torch.equal(got[0, 2], weight[3]) and torch.equal(got[1, 2], weight[1])
    assert not got[0, 1].any() and not got[1, 0].any() and not got[1, 1].any()


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint8, torch.bfloat16, torch.float16, torch.float32])
def test_raw_rows_of_every_stored_dtype_with_zeros_for_dead_and_unowned(path: str, dtype: torch.dtype) -> None:
    """Rows in their stored dtype (fp8 bytes, packed NVFP4 bytes, floats): each owned row's bytes, zero
    bytes for DEAD_ID and rows of other shards. The plain-torch fallback too: torch has no masked fill for
    fp8, so a fallback that zeroes by value crashes there."""
    raw = torch.randint(1, 256, (4, 32 * dtype.itemsize), dtype=torch.uint8, generator=torch.Generator().manual_seed(9))
    weight = raw.view(dtype)
    ids = torch.tensor([12, -1, 9, 10, 14])  # the shard holds rows 10..13 of a 20-row table
    got = PATHS[path](weight, None, ids, 10, 20, dtype)
    assert got is not None and got.dtype == dtype and got.shape == (5, 32)
    zero = torch.zeros(32 * dtype.itemsize, dtype=torch.uint8)
    want = torch.stack([raw[2], zero, zero, raw[0], zero])
    assert torch.equal(got.view(torch.uint8), want)


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
@pytest.mark.parametrize("bad", [20, 1 << 40, -2])
def test_ids_outside_the_table_raise(path: str, bad: int) -> None:
    weight = torch.zeros(4, 32)
    with pytest.raises(EngramError, match=rf"row id {bad} is outside the table's 20 rows \(DEAD_ID is -1\)"):
        PATHS[path](weight, None, torch.tensor([3, bad]), 10, 20, torch.float32)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 50),
    st.integers(0, 40),
    st.sampled_from(["fp8", "bf16", "fp32"]),
    st.lists(st.integers(-1, 99), max_size=30),
)
def test_native_equals_torch(shard_rows: int, row_start: int, dtype: str, ids: list[int]) -> None:
    shard = allocate("t", ShardFormat(shard_rows, 64, dtype), "host")
    generator = torch.Generator().manual_seed(shard_rows * 131 + row_start)
    shard.weight.view(torch.uint8).copy_(
        torch.randint(0, 255, shard.weight.view(torch.uint8).shape, dtype=torch.uint8, generator=generator)
    )
    if shard.scale is not None:
        shard.scale.view(torch.uint8).copy_(
            torch.randint(100, 150, shard.scale.shape, dtype=torch.uint8, generator=generator)
        )
    tensor = torch.tensor(ids, dtype=torch.int64)
    out_dtype = torch.bfloat16 if dtype == "fp8" else shard.weight.dtype
    want = gather_reference(shard.weight, shard.scale, tensor, row_start, 100, out_dtype)
    got = gather(shard.weight, shard.scale, tensor, row_start, 100, out_dtype)
    assert got.shape == (len(ids), 64)
    nan = torch.isnan(want.float())
    assert torch.equal(nan, torch.isnan(got.float())) and torch.equal(got[~nan], want[~nan])


def test_int32_ids_and_embedding_errors() -> None:
    shard = allocate("t", ShardFormat(10, 32, "bf16"), "host")
    shard.weight.copy_(torch.randn(10, 32).to(torch.bfloat16))
    module = EngramEmbedding(shard, TableShardPlan("t", 10, "row", 0, 10, 0, 2), columns=2)
    ids = torch.tensor([[1, 2], [-1, 9]], dtype=torch.int32)
    assert torch.equal(module(ids), module(ids.to(torch.int64)))
    with pytest.raises(EngramError, match=r"ids must be int64 or int32 \[tokens, 2\], got torch.int64 \[2, 3\]"):
        module(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(EngramError, match="row id 10 is outside the table's 10 rows"):
        module(torch.tensor([[1, 10]]))


class Tower(torch.nn.Module):
    """A module that calls EngramEmbedding inside other work, as a model layer would."""

    def __init__(self, embedding: EngramEmbedding) -> None:
        super().__init__()
        self.embedding = embedding
        self.proj = torch.nn.Linear(32, 8, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.embedding(ids).sum(dim=1))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")  # inside inductor
def test_torch_compile_matches_eager() -> None:
    shard = allocate("t", ShardFormat(64, 32, "fp8"), "host")
    generator = torch.Generator().manual_seed(0)
    shard.weight.copy_((torch.randn(64, 32, generator=generator) * 10).to(torch.float8_e4m3fn))
    assert shard.scale is not None
    shard.scale.view(torch.uint8).fill_(125)
    torch.manual_seed(0)
    tower = Tower(EngramEmbedding(shard, TableShardPlan("t", 64, "row", 0, 64, 0, 3), columns=3)).eval()
    ids = torch.randint(-1, 64, (5, 3))
    compiled = torch.compile(tower, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(ids), tower(ids))
        assert torch.equal(compiled(ids.flip(0)), tower(ids.flip(0)))


def test_kept_output_buffer() -> None:
    shard = allocate("t", ShardFormat(50, 32, "fp8"), "host")
    shard.weight.view(torch.uint8).copy_(torch.randint(0, 120, (50, 32), dtype=torch.uint8))
    assert shard.scale is not None
    shard.scale.view(torch.uint8).fill_(127)
    module = EngramEmbedding(shard, TableShardPlan("t", 50, "row", 0, 50, 0, 4), columns=4)
    ids = torch.randint(-1, 50, (6, 4))
    buffer = torch.full((6, 4, 32), 3.0, dtype=torch.bfloat16)
    result = module(ids, out=buffer)
    assert result.data_ptr() == buffer.data_ptr() and torch.equal(buffer, module(ids))
    gather_into(shard.weight, shard.scale, ids[:2], 0, 50, buffer[:2])
    assert torch.equal(buffer[:2], module(ids[:2]))
    with pytest.raises(
        EngramError, match=r"out must be a contiguous tensor of shape \[6, 4, 32\] on cpu, got \[6, 4, 31\] on cpu"
    ):
        module(ids, out=torch.empty((6, 4, 31), dtype=torch.bfloat16))
    with pytest.raises(EngramError, match=r"out must be torch\.bfloat16, got torch\.float32"):
        module(ids, out=torch.empty((6, 4, 32)))


def guarded_scale(rows: int, columns: int) -> torch.Tensor:
    """A ue8m0 scale whose last byte sits right before a page the process may not touch: any read past
    its end is a SIGSEGV, not a silently accepted call."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    region = mmap.mmap(-1, 2 * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert libc.mprotect(ctypes.c_void_p(base + mmap.PAGESIZE), mmap.PAGESIZE, 0) == 0  # PROT_NONE
    nbytes = rows * columns
    array = (ctypes.c_uint8 * nbytes).from_address(base + mmap.PAGESIZE - nbytes)
    tensor = torch.frombuffer(array, dtype=torch.uint8).view(rows, columns).view(torch.float8_e8m0fnu)
    tensor._keep = region  # type: ignore[attr-defined]  # the mapping lives as long as the tensor
    return tensor


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
def test_a_short_scale_is_refused_before_any_read(path: str) -> None:
    weight = torch.zeros(5000, 32, dtype=torch.float8_e4m3fn)
    with pytest.raises(
        EngramError, match=r"scale must be a contiguous torch.float8_e8m0fnu tensor of shape \[5000, 1\]"
    ):
        PATHS[path](weight, guarded_scale(1, 1), torch.tensor([4999, 0]), 0, 5000, torch.bfloat16)
    with pytest.raises(
        EngramError, match=r"shape \[5000, 1\] \(one per block of 32\); got torch.float8_e8m0fnu \[5000, 2\]"
    ):
        PATHS[path](
            weight, torch.zeros(5000, 2, dtype=torch.float8_e8m0fnu), torch.tensor([1]), 0, 5000, torch.bfloat16
        )


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
def test_what_the_kernels_do_not_implement_is_refused(path: str) -> None:
    fp8 = torch.zeros(10, 32, dtype=torch.float8_e4m3fn)
    ids = torch.tensor([1, 2])
    cases = [
        (
            fp8,
            torch.ones(10, 1),
            torch.bfloat16,
            r"scale must be a contiguous torch.float8_e8m0fnu tensor .* got torch.float32",
        ),
        (
            torch.zeros(10, 32, dtype=torch.bfloat16),
            torch.zeros(10, 1, dtype=torch.float8_e8m0fnu),
            torch.bfloat16,
            "a scale goes with fp8",
        ),
        (fp8, None, torch.bfloat16, "fp8 rows need their ue8m0 block scales to be dequantised: pass scale"),
        (
            fp8,
            torch.zeros(10, 1, dtype=torch.float8_e8m0fnu),
            torch.float16,
            r"fp8 rows dequantise into torch.float32 or torch.bfloat16; got torch.float16",
        ),
        (torch.zeros(10, 32, 1), None, torch.float32, r"weight must be a contiguous 2-D table"),
        (torch.zeros(10, 32, dtype=torch.int64), None, torch.int64, r"weight must be a contiguous 2-D table"),
    ]
    for weight, scale, out_dtype, message in cases:
        with pytest.raises(EngramError, match=message):
            PATHS[path](weight, scale, ids, 0, 10, out_dtype)


@pytest.mark.parametrize("path", ["native", "sorted", "torch"])
@pytest.mark.parametrize(
    "ids",
    [
        torch.tensor([1.0, 2.5]),
        torch.tensor([True, False]),
        torch.tensor([float("nan")]),
        torch.tensor([1, 2], dtype=torch.uint8),
    ],
)
def test_ids_must_be_integers(path: str, ids: torch.Tensor) -> None:
    with pytest.raises(EngramError, match=r"ids must be int64 or int32 row ids; got"):
        PATHS[path](torch.zeros(10, 32), None, ids, 0, 10, torch.float32)


def test_shard_outside_its_table_and_conversions() -> None:
    weight = torch.arange(4 * 32, dtype=torch.float32).view(4, 32)
    with pytest.raises(EngramError, match=r"the shard's rows \[8, 12\) must lie inside the table's 10 rows"):
        gather(weight, None, torch.tensor([9]), 8, 10, torch.float32)
    converted = gather(
        weight, None, torch.tensor([2, -1]), 0, 4, torch.bfloat16
    )  # a real conversion, never a reinterpretation
    assert torch.equal(converted, gather_reference(weight, None, torch.tensor([2, -1]), 0, 4, torch.bfloat16))
    assert torch.equal(converted[0], weight[2].to(torch.bfloat16)) and not converted[1].any()


@pytest.mark.parametrize("offset, width", [(0, 16), (8, 8), (4, 1), (1, 1)])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fp8_tables_at_any_alignment_take_the_load_width_they_allow(
    offset: int, width: int, out_dtype: torch.dtype
) -> None:
    """safetensors aligns tensor data to 8 bytes only: the gathers load 16, 8 or 1 bytes at a time as the
    table's address allows (the CUDA gather's rule, engram_vector_bytes, which the CPU twin follows), and
    every width gives the reference's rows."""
    library = cpu.cpu_library()
    assert library is not None
    rows, dim = 300, 96
    generator = torch.Generator().manual_seed(offset)
    backing = torch.randint(0, 256, (rows * dim + 16,), dtype=torch.uint8, generator=generator)
    weight = backing[offset : offset + rows * dim].view(torch.float8_e4m3fn).view(rows, dim)
    scale = torch.randint(110, 140, (rows, dim // 32), dtype=torch.uint8, generator=generator).view(
        torch.float8_e8m0fnu
    )
    assert weight.data_ptr() % 16 == offset
    assert library.engram_vector_bytes_cpu(weight.data_ptr(), dim) == width
    ids = torch.randint(-1, rows, (200,), generator=generator)
    want = gather_reference(weight, scale, ids, 0, rows, out_dtype)
    bits = torch.int16 if out_dtype == torch.bfloat16 else torch.int32
    for sorted_form in (False, True):
        got = gather(weight, scale, ids, 0, rows, out_dtype, sorted_form)
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan)
        assert torch.equal(got[~nan].view(bits), want[~nan].view(bits))


def test_the_ops_pass_torch_opcheck() -> None:
    """Schemas, fake kernels, autograd registration and AOT dispatch of the low-level op declarations."""
    from engram.apps.presets import get_preset

    weight = torch.randn(50, 32).to(torch.bfloat16)
    ids = torch.randint(-1, 50, (7, 3), generator=torch.Generator().manual_seed(2))
    out = torch.empty(7, 3, 32, dtype=torch.bfloat16)
    torch.library.opcheck(gather, (weight, None, ids, 0, 50, torch.bfloat16))
    torch.library.opcheck(gather_into, (weight, None, ids, 0, 50, out, True))
    hasher = get_preset("deepseek-v4.1-flash").hasher()
    tokens = torch.randint(0, hasher.layout.vocab, (9,), generator=torch.Generator().manual_seed(3))
    ext = torch.cat([hasher.new_state().history, tokens])
    start = torch.zeros(9, dtype=torch.int64)
    rows = torch.empty((9, len(hasher.layout.layer_ids), hasher.layout.columns), dtype=torch.int64)
    tables = hasher._tables(torch.device("cpu"))
    torch.library.opcheck(torch.ops.engram.ngram_hash.default, (ext, start, *tables, 5, hasher.layout.vocab, rows))


def test_fp8_nans_dequantise_to_a_quiet_nan_of_their_sign() -> None:
    """engram's bf16 NaN keeps the sign (0x7FC0, 0xFFC0); torch writes 0x7FC0 (scalar, CUDA) or 0xFFFF (its
    CPU vector path) for every NaN, so NaN rows are compared as NaN, never byte for byte."""
    weight = torch.tensor([[0x7F] * 32, [0xFF] * 32], dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.full((2, 1), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    rows = gather(weight, scale, torch.tensor([0, 1]), 0, 2, torch.bfloat16).view(torch.int16)
    assert (rows[0] == 0x7FC0).all() and (rows[1] == -64).all()  # -64: 0xFFC0 as int16


def test_missing_kernel_sources_are_named_where_the_native_kernels_are_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An install without the kernel sources says so, and what to do, rather than blaming the compiler; the
    plain-torch fallback still answers."""
    from engram.runtime.checkpoints.loader import Checkpoint
    from engram.runtime.placement.filemap import file_shard

    monkeypatch.setattr(cpu, "KERNELS", tmp_path)
    cpu._built.cache_clear()
    try:
        reason = (
            f"engram's kernel sources are missing from {tmp_path}; reinstall engram from a complete wheel or checkout"
        )
        assert cpu.cpu_library() is None and cpu.unavailable_reason() == reason
        with pytest.raises(EngramError) as caught:
            file_shard("t", ShardFormat(4, 32, "fp8"), 0, 4, Checkpoint.__new__(Checkpoint), None)
        assert str(caught.value) == (
            f"file_backed tables are read only by the guarded native CPU kernels, unavailable here: {reason}"
        )
        weight = torch.arange(64, dtype=torch.float32).view(2, 32)
        assert torch.equal(gather(weight, None, torch.tensor([1, -1]), 0, 2, torch.float32)[0], weight[1])
    finally:
        monkeypatch.undo()
        cpu._built.cache_clear()
    assert cpu.cpu_library() is not None


def test_the_ops_are_declared_from_the_one_call_record() -> None:
    """engram::gather and engram::gather_into take GatherCall's fields in its order (the output as a
    dtype, or a buffer), and help(engram.ops.gather) shows the record's contract."""
    import dataclasses
    import pydoc

    from engram.ops import GatherCall

    names = [f.name for f in dataclasses.fields(GatherCall)]
    for op, out in ((gather, "out_dtype"), (gather_into, "out")):
        declared = [a.name for a in op._schema.arguments]
        assert declared == [out if n == "out" else n for n in names]
    shown = pydoc.render_doc(gather)
    assert GatherCall.__doc__ is not None and GatherCall.__doc__.splitlines()[1].strip() in shown
    weight = torch.arange(8, dtype=torch.float32).view(4, 2)
    ids = torch.tensor([[3, -1], [0, 3]])
    call = GatherCall(weight, None, ids, 1, 5, torch.float32, sorted=True)
    assert torch.equal(call.run(), torch.tensor([[[4.0, 5.0], [0, 0]], [[0, 0], [4.0, 5.0]]]))
