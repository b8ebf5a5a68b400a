"""Bit-exact comparisons, the two every test uses: same_bits for floats (a NaN equals any NaN, whatever
its payload; every other element by its bits, so -0.0 is not +0.0) and same_bytes for anything (every
byte). Both need the same dtype and shape."""

from __future__ import annotations

import torch

INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same dtype, shape and bits, NaNs counted equal whatever their payload."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    bits = INTEGERS[want.element_size()]
    nan = torch.isnan(want)
    return bool(torch.equal(nan, torch.isnan(got)) and torch.equal(got[~nan].view(bits), want[~nan].view(bits)))


def same_bytes(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Same dtype, shape and every byte."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    return torch.equal(got.contiguous().view(torch.uint8), want.contiguous().view(torch.uint8))
