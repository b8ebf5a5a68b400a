"""The row formats a table may be stored in, and what each holds: the weight's dtype (NVFP4 packs two
values a byte), per-row block scales, one float scale for the whole table, and the checkpoint's names for
each part. The kernels dequantise every scaled format (engram.ops.checks.row_format picks the kernel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowFormat:
    weight: torch.dtype
    per_element: int = 1  # values a weight element holds
    scale: torch.dtype | None = None  # per-row block scales
    block: int = 0  # values per block scale
    table_scale: bool = False  # one float32 scale for the table
    # the checkpoint's tensor suffix of the block scales and of the table scale
    scale_name: str = "scale"
    table_scale_name: str = ""

    def weight_width(self, dim: int) -> int:
        return dim // self.per_element

    def scale_width(self, dim: int) -> int:
        return dim // self.block if self.scale is not None else 0

    def row_bytes(self, dim: int) -> int:
        """Bytes of one stored row, block scales included (the table scale is per table, not per row)."""
        scale = self.scale_width(dim) * self.scale.itemsize if self.scale is not None else 0
        return self.weight_width(dim) * self.weight.itemsize + scale

    def check_dim(self, name: str, dim: int) -> str | None:
        """Why rows of `dim` values cannot be stored as `name`, or None."""
        step = max(self.block, self.per_element)
        return f"{name} rows need a dim divisible by {step}, got {dim}" if step > 1 and dim % step else None


# DeepSeek V4.1 stores fp8 with ue8m0 block-32 scales (`.scale`); Qwen4Exp as vLLM 0.33 loads it: fp8 with
# one float32 `weight_scale`, or NVFP4 with e4m3 block-16 `weight_scale` and a float32 `weight_scale_2`.
FORMATS: dict[str, RowFormat] = {
    "fp8": RowFormat(torch.float8_e4m3fn, scale=torch.float8_e8m0fnu, block=32),
    "fp8-table": RowFormat(torch.float8_e4m3fn, table_scale=True, table_scale_name="weight_scale"),
    "nvfp4": RowFormat(
        torch.uint8,
        per_element=2,
        scale=torch.float8_e4m3fn,
        block=16,
        table_scale=True,
        scale_name="weight_scale",
        table_scale_name="weight_scale_2",
    ),
    "bf16": RowFormat(torch.bfloat16),
    "fp16": RowFormat(torch.float16),
    "fp32": RowFormat(torch.float32),
}
