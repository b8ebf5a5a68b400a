"""Qwen4Exp's scaled row formats (engram.ops.formats): fp8 with one float scale per table and NVFP4 (two
e2m1 codes a byte, e4m3 block-16 scales, a table scale). Every code and scale byte dequantises as vLLM
0.33 does it, computed here independently in float64; the native twin (plain and sorted) equals plain
torch on random tables, shard offsets, dead and unowned ids; bad arguments are refused before any read."""

from __future__ import annotations

import pytest
import torch

from engram.errors import EngramError
from engram.ops import cpu, gather, gather_into, gather_reference
from engram.runtime.checkpoints.quantize import quantize_fp8_table, quantize_nvfp4
from tests.bits import same_bits

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
PATHS = ["native", "sorted", "torch"]


def run(path: str, weight: torch.Tensor, scale: torch.Tensor | None, ids: torch.Tensor, row_start: int,
        table_rows: int, out_dtype: torch.dtype, table_scale: float) -> torch.Tensor:  # fmt: skip
    if path == "torch":
        return gather_reference(weight, scale, ids, row_start, table_rows, out_dtype, table_scale=table_scale)
    assert cpu.cpu_library() is not None  # the native twin, not the torch fallback
    dim = weight.shape[1] * (2 if weight.dtype == torch.uint8 else 1)
    out = torch.full((*ids.shape, dim), 7, dtype=out_dtype)  # poisoned: every element must be written
    gather_into(weight, scale, ids, row_start, table_rows, out, path == "sorted", None, table_scale)
    return out


def e4m3_float64(byte: int) -> float:
    """e4m3fn from its bits, independently of torch's conversion."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 7
    if exponent == 0xF and mantissa == 7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_every_fp8_byte_times_the_table_scale(path: str, out_dtype: torch.dtype) -> None:
    """vLLM: rows.to(out_dtype) * weight_scale.to(out_dtype); a bf16 output sees the scale rounded to bf16."""
    weight = torch.arange(256, dtype=torch.uint8).view(1, 256).view(torch.float8_e4m3fn)
    table_scale = 0.0123456789
    got = run(path, weight, None, torch.tensor([0]), 0, 1, out_dtype, table_scale)
    factor = torch.tensor(table_scale, dtype=torch.float64).to(out_dtype).double()
    want = torch.tensor([e4m3_float64(b) for b in range(256)], dtype=torch.float64) * factor
    assert same_bits(got[0], want.to(out_dtype))
    vllm_style = weight.to(out_dtype) * torch.tensor(table_scale).to(out_dtype)
    assert same_bits(got[0], vllm_style[0])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_every_nvfp4_code_and_block_scale(path: str, out_dtype: torch.dtype) -> None:
    """Row s holds all 256 code pairs (the low nibble is the even element), every block scaled by e4m3
    byte s: each code's value times each scale, times the table scale, as (e2m1 * scale) * table_scale."""
    weight = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # [256 rows, 256 bytes = 512 values]
    scale = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 32).view(torch.float8_e4m3fn)
    table_scale = 1.0 / 3.0
    got = run(path, weight, scale, torch.arange(256), 0, 256, out_dtype, table_scale)
    codes = torch.stack([weight & 0xF, weight >> 4], dim=2).reshape(256, 512).long()
    values = torch.tensor([v if c < 8 else -v for c in range(16) for v in [E2M1[c % 8]]], dtype=torch.float64)
    blocks = torch.tensor([e4m3_float64(b) for b in range(256)], dtype=torch.float64)[:, None]
    want = ((values[codes] * blocks).float() * torch.tensor(table_scale, dtype=torch.float32)).to(out_dtype)
    assert same_bits(got, want)


@pytest.mark.parametrize("dtype", ["fp8-table", "nvfp4"])
@pytest.mark.parametrize("path", ["native", "sorted"])
def test_native_equals_torch_on_random_tables(dtype: str, path: str) -> None:
    generator = torch.Generator().manual_seed(5)
    values = torch.randn(50, 96, generator=generator) * 0.05
    if dtype == "nvfp4":
        weight, scale = quantize_nvfp4(values, 0.001)
    else:
        weight, scale = quantize_fp8_table(values, 0.001), None
    ids = torch.randint(-1, 200, (7, 5), generator=generator)  # DEAD_ID, owned rows 30..79, rows of other shards
    ids[0, :3] = torch.tensor([30, 79, 30])
    for out_dtype in (torch.bfloat16, torch.float32):
        want = gather_reference(weight, scale, ids, 30, 200, out_dtype, table_scale=0.001)
        got = run(path, weight, scale, ids, 30, 200, out_dtype, 0.001)
        assert same_bits(got, want)
        assert torch.count_nonzero(want[ids < 30]) == 0 and torch.count_nonzero(want[ids >= 80]) == 0
    assert gather(weight, scale, ids, 30, 200, torch.float32, table_scale=0.001).shape == (7, 5, 96)


def test_quantizers_round_trip_within_their_step() -> None:
    values = (torch.randn(64, 32, generator=torch.Generator().manual_seed(1)) * 0.05).clamp(-0.25, 0.25)
    fp8 = gather_reference(
        quantize_fp8_table(values, 0.25 / 448), None, torch.arange(64), 0, 64, torch.float32, table_scale=0.25 / 448
    )
    assert torch.allclose(fp8, values, rtol=0.07, atol=1e-6)
    packed, scale = quantize_nvfp4(values, 0.25 / (6 * 448))
    assert packed.shape == (64, 16) and scale.shape == (64, 2)
    nvfp4 = gather_reference(packed, scale, torch.arange(64), 0, 64, torch.float32, table_scale=0.25 / (6 * 448))
    amax = values.view(64, 2, 16).abs().amax(dim=2).repeat_interleave(16, dim=1)
    assert torch.all((nvfp4 - values).abs() <= amax / 6 * 1.07 + 1e-7)  # half e2m1's widest step (4 to 6)
    assert torch.equal(torch.sign(nvfp4[nvfp4 != 0]), torch.sign(values[nvfp4 != 0]))


@pytest.mark.parametrize("path", PATHS)
def test_scaled_rows_refused_before_any_read(path: str) -> None:
    packed = torch.zeros(4, 8, dtype=torch.uint8)
    cases = [
        (packed, None, "NVFP4 rows need a contiguous float8_e4m3fn scale of shape \\[4, 1\\]"),
        (packed, torch.zeros(3, 1, dtype=torch.float8_e4m3fn), "of shape \\[4, 1\\] \\(one per block of 16\\)"),
        (torch.zeros(4, 4, dtype=torch.uint8), torch.zeros(4, 0, dtype=torch.float8_e4m3fn), "NVFP4 rows need a dim divisible by 16; got 8"),
        (torch.zeros(4, 16, dtype=torch.float8_e4m3fn), torch.zeros(4, 1, dtype=torch.float8_e4m3fn), "fp8 rows take ue8m0 block scales or one table scale, not both"),
        (torch.zeros(4, 16, dtype=torch.bfloat16), None, "a table scale goes with fp8 \\(float8_e4m3fn\\) or NVFP4"),
    ]  # fmt: skip
    for weight, scale, message in cases:
        with pytest.raises(EngramError, match=message):
            run(path, weight, scale, torch.tensor([0]), 0, 4, torch.float32, 1.0)
    with pytest.raises(EngramError, match="scaled rows dequantise into"):
        run(path, packed, torch.zeros(4, 1, dtype=torch.float8_e4m3fn), torch.tensor([0]), 0, 4, torch.float16, 1.0)
