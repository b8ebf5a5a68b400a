"""The one body of each op on every device: check the arguments, then launch the kernel the device's entry
in the launch tables names. The CPU twins are entered here; engram.ops.cuda enters the CUDA kernels when it
is imported (engram.ops.devices.ensure_kernels), so nothing below it imports the CUDA side."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from engram.errors import EngramError
from engram.ops import cpu
from engram.ops.checks import ID_DTYPES, RUN_DIRECT, GatherCall, HashCall, check_gather_args, check_out, describe
from engram.ops.segments import Segmented

Launch = Callable[[GatherCall], None]

# The kernel launch per device type (arguments already checked): the CPU twin here; engram.ops.cuda adds
# "cuda" when it is imported (engram.ops.devices.ensure_kernels), so this layer never imports the CUDA side.
LAUNCHERS: dict[str, Launch] = {"cpu": cpu.launch_gather}


def run_gather(call: GatherCall) -> None:
    """The one body of engram::gather and engram::gather_into on every device (`call.out` a buffer):
    check every argument, then launch the device's kernel. A dtype conversion the kernels do not make
    (rows stored as one float type, wanted as another) becomes a raw gather and a torch copy, so no path
    ever reinterprets bytes."""
    ids, out = call.ids, call.out
    assert isinstance(out, torch.Tensor)
    launch = LAUNCHERS.get(ids.device.type)
    if launch is None:
        raise EngramError(
            f"no engram gather kernel for {ids.device.type} tensors (import engram.ops.cuda for CUDA); put the ids on the CPU or a GPU"
        )
    if ids.device.type != "cpu" and isinstance(call.weight, Segmented):
        raise EngramError(
            f"the table's rows lie in {len(call.weight.pieces)} pieces of its checkpoint's files, read on the CPU only; look it up with CPU ids (the table layer stages such tables through host memory)"
        )
    if ids.device.type == "cpu":
        for name, t in (("weight", call.weight), ("scale", call.scale), ("out", out)):
            if t is not None and t.device.type != "cpu":
                raise EngramError(f"ids are on the CPU but {name} is on {t.device}: put them on one device")
    check_gather_args(call)
    check_out(ids, call.dim, out)
    if call.check is not None and (call.check.dtype not in ID_DTYPES or call.check.device != ids.device):
        raise EngramError(f"check must hold int64 or int32 row ids on {ids.device}; got {describe(call.check)}")
    if call.scale is None and call.table_scale is None and out.dtype != call.weight.dtype:
        raw = torch.empty(out.shape, dtype=call.weight.dtype, device=out.device)
        launch(replace(call, out=raw))
        out.copy_(raw)
    else:
        launch(call)


RUN_DIRECT.append(run_gather)

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
