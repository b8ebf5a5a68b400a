"""Which kernels serve a device: the CPU twins come with engram.ops; the CUDA kernels register themselves
when engram.ops.cuda is first imported, which happens here, above both (ops never imports kernels)."""

from __future__ import annotations

import torch


def ensure_kernels(device: torch.device) -> None:
    """Register the CUDA kernels before the first op on a GPU."""
    if device.type == "cuda":
        import engram.ops.cuda  # noqa: F401
