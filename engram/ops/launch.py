"""The one body of each op on every device: check the arguments, then launch the kernel the device's entry
in the launch tables names. The CPU twins are entered here; engram.ops.cuda enters the CUDA kernels when it
is imported (engram.ops.devices.ensure_kernels), so nothing below it imports the CUDA side."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engram.errors import EngramError
from engram.ops import cpu
from engram.ops.checks import ID_DTYPES, GatherCall, HashCall, check_gather_args, check_out, describe, row_format

Launch = Callable[[GatherCall], None]

# The kernel launch per device type (arguments already checked): the CPU twin here; engram.ops.cuda adds
# "cuda" when it is imported (engram.ops.devices.ensure_kernels), so this layer never imports the CUDA side.
LAUNCHERS: dict[str, Launch] = {"cpu": cpu.launch_gather}


def run_gather(
    weight: torch.Tensor,
    scale: torch.Tensor | None,
    ids: torch.Tensor,
    row_start: int,
    table_rows: int,
    out: torch.Tensor,
    dedup: bool = False,
    check: torch.Tensor | None = None,
    table_scale: float | None = None,
) -> None:
    """The one body of engram::gather and engram::gather_into on every device: check every argument,
    then launch the device's kernel. A dtype conversion the kernels do not make (rows stored as one float
    type, wanted as another) becomes a raw gather and a torch copy, so no path ever reinterprets bytes."""
    launch = LAUNCHERS.get(ids.device.type)
    if launch is None:
        raise EngramError(
            f"no engram gather kernel for {ids.device.type} tensors (import engram.ops.cuda for CUDA); put the ids on the CPU or a GPU"
        )
    if ids.device.type == "cpu":
        for name, t in (("weight", weight), ("scale", scale), ("out", out)):
            if t is not None and t.device.type != "cpu":
                raise EngramError(f"ids are on the CPU but {name} is on {t.device}: put them on one device")
    check_gather_args(weight, scale, ids, row_start, table_rows, out.dtype, table_scale)
    check_out(ids, row_format(weight, scale, table_scale)[1], out)
    if check is not None and (check.dtype not in ID_DTYPES or check.device != ids.device):
        raise EngramError(f"check must hold int64 or int32 row ids on {ids.device}; got {describe(check)}")
    if scale is None and table_scale is None and out.dtype != weight.dtype:
        raw = torch.empty(out.shape, dtype=weight.dtype, device=out.device)
        launch(GatherCall(weight, None, ids, row_start, table_rows, raw, dedup, check))
        out.copy_(raw)
    else:
        launch(GatherCall(weight, scale, ids, row_start, table_rows, out, dedup, check, table_scale))


HashLaunch = Callable[[HashCall], None]

HASHERS: dict[str, HashLaunch] = {"cpu": cpu.launch_hash}  # engram.ops.cuda adds "cuda"


def run_hash(
    ext: torch.Tensor,
    start: torch.Tensor,
    multipliers: torch.Tensor,
    primes: torch.Tensor,
    magic: torch.Tensor,
    offsets: torch.Tensor,
    fill: int,
    vocab: int,
    out: torch.Tensor,
) -> None:
    """The one body of engram::ngram_hash on every device: the device's kernel, which checks the new token
    ids (the CPU raises, a GPU flags them)."""
    launch = HASHERS.get(ext.device.type)
    if launch is None:
        raise EngramError(f"no engram hash kernel for {ext.device.type} tensors (import engram.ops.cuda for CUDA)")
    launch(HashCall(ext, start, multipliers, primes, magic, offsets, fill, vocab, out))
