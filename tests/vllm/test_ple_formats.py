"""Qwen4Exp's quantised PLE tables against vLLM 0.33.0's own dequantisation (tests/vllm/runner.py): FP8
with one scale per table (Qwen4ExpPLEFp8EmbeddingMethod.dequantize) and NVFP4 (its Triton lookup kernel),
into bf16 and float32, on every fp8 byte, every NVFP4 code pair and every e4m3 block scale, and on rows
make-checkpoint writes: engram's gather returns the same bits."""

from __future__ import annotations

import pytest
import torch

from engram.ops import gather
from engram.runtime.checkpoints.writer import synthetic_table
from tests.vllm.runner import ask_vllm, needs_vllm

pytestmark = needs_vllm


def tables() -> list[tuple[str, torch.Tensor, torch.Tensor | None, float]]:
    every_fp8 = torch.arange(256, dtype=torch.uint8).view(2, 128)
    every_code = torch.arange(256, dtype=torch.uint8).repeat(256, 1)  # 512 values a row
    every_scale = torch.arange(256, dtype=torch.uint8)[:, None].repeat(1, 32)
    synthetic = synthetic_table(64, 96, "nvfp4", seed=4)
    fp8 = synthetic_table(64, 96, "fp8-table", seed=4)
    return [
        ("fp8-table", every_fp8, None, 0.0123456789),
        ("fp8-table", fp8["weight"].view(torch.uint8), None, float(fp8["weight_scale"])),
        ("nvfp4", every_code, every_scale, 1.0 / 3.0),
        ("nvfp4", synthetic["weight"], synthetic["weight_scale"].view(torch.uint8), float(synthetic["weight_scale_2"])),
    ]


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_ple_rows_equal_vllm(out_dtype: str) -> None:
    cases, ours = [], []
    for dtype, weight, scale, table_scale in tables():
        ids = torch.arange(weight.shape[0])
        cases.append(
            {
                "dtype": dtype,
                "weight": weight.tolist(),
                "scale": None if scale is None else scale.tolist(),
                "table_scale": table_scale,
                "ids": ids.tolist(),
                "out_dtype": out_dtype,
            }
        )
        stored = weight.view(torch.float8_e4m3fn) if dtype == "fp8-table" else weight
        scales = None if scale is None else scale.view(torch.float8_e4m3fn)
        rows = gather(stored, scales, ids, 0, weight.shape[0], getattr(torch, out_dtype), table_scale=table_scale)
        ours.append(rows.view(torch.int16 if out_dtype == "bfloat16" else torch.int32).tolist())
    theirs = ask_vllm("ple_rows", cases)
    bits = torch.int16 if out_dtype == "bfloat16" else torch.int32
    # the NaN bytes: e4m3 0x7F and 0xFF as values (every fp8 byte) or as block scales (rows 127 and 255)
    nans = [2, 0, 2 * 512, 0]
    for case, mine, vllm, expected_nans in zip(cases, ours, theirs, nans, strict=True):
        a = torch.tensor(mine, dtype=bits).view(getattr(torch, out_dtype))
        b = torch.tensor(vllm["bits"], dtype=bits).view(getattr(torch, out_dtype))
        nan = torch.isnan(a)  # NaN payloads differ between torch's paths: a NaN is compared as a NaN
        assert torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan].view(bits), b[~nan].view(bits)), case["dtype"]
        assert int(nan.sum()) == expected_nans
