"""Checkpoint loading into table shards through per-parameter weight loaders `(param, loaded_tensor)`.

safetensors files are read lazily through a private mapping of the file: a shard's weight loader narrows
to the rows it owns and copies only those pages. Headers, shapes and dtypes are validated before any
byte is copied. `.pt` files load with weights_only=True: pickled objects other than tensors are refused.
"""

from __future__ import annotations

import functools
import mmap
import os
import pickle
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from tqdm import tqdm

from engram.errors import EngramError
from engram.runtime.dist import Group, barrier
from engram.runtime.storage import SCALE_DTYPE, WEIGHT_DTYPES, TableShard

SAFETENSORS_DTYPES = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E8M0": torch.float8_e8m0fnu,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
MAX_HEADER = 100 << 20
COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """A validated safetensors file whose tensors are views of a private (copy-on-write) file mapping."""

    def __init__(self, path: Path) -> None:
        self.path = path
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise self._error(f"only {size} bytes: too short for a safetensors header")
            header_len = int.from_bytes(head, "little")
            if header_len > MAX_HEADER or 8 + header_len > size:
                raise self._error(
                    f"header length {header_len:,} does not fit a {size:,}-byte file (truncated or not safetensors)"
                )
            raw = f.read(header_len)
        try:
            header = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise self._error(f"header is not valid JSON: {exc}") from None
        if not isinstance(header, dict):
            raise self._error("header is not a JSON object")
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        self.entries = {
            name: self._entry(name, spec, data_len) for name, spec in header.items() if name != "__metadata__"
        }
        with path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else None

    def _error(self, message: str) -> EngramError:
        return EngramError(f"{self.path}: {message}")

    def _entry(self, name: str, spec: Any, data_len: int) -> TensorEntry:
        if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
            raise self._error(f"tensor {name!r}: header entry needs dtype, shape and data_offsets")
        dtype = SAFETENSORS_DTYPES.get(spec["dtype"])
        if dtype is None:
            raise self._error(f"tensor {name!r}: unsupported dtype {spec['dtype']!r}")
        shape, offsets = spec["shape"], spec["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise self._error(f"tensor {name!r}: bad shape {shape!r}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise self._error(f"tensor {name!r}: bad data_offsets {offsets!r}")
        begin, end = offsets
        count = 1
        for d in shape:
            count *= d
        if not 0 <= begin <= end or end - begin != count * dtype.itemsize:
            raise self._error(f"tensor {name!r}: data_offsets {offsets} do not hold {shape} x {spec['dtype']}")
        if end > data_len:
            raise self._error(
                f"truncated: tensor {name!r} ends at byte {self.data_start + end:,} but the file has {self.data_start + data_len:,}"
            )
        return TensorEntry(dtype, tuple(shape), begin, end)

    def read_rows(
        self, name: str, start: int, out: torch.Tensor, on_bytes: Callable[[int], None] | None = None
    ) -> None:
        """Rows [start, start + len(out)) of tensor `name` straight into `out` with pread: the page cache
        is copied once, without faulting in a mapping of the file first."""
        entry = self.entries[name]
        row_bytes = out[:1].numel() * out.element_size() if out.dim() else out.element_size()
        target = memoryview(out.view(torch.uint8).view(-1).numpy())  # type: ignore[arg-type]
        offset, done = self.data_start + entry.begin + start * row_bytes, 0
        with self.path.open("rb", buffering=0) as f:
            while done < len(target):
                n = os.preadv(f.fileno(), [target[done : done + COPY_CHUNK]], offset + done)
                if n == 0:
                    raise self._error(f"tensor {name!r} ended early: the file shrank while loading")
                done += n
                if on_bytes is not None:
                    on_bytes(n)

    def tensor(self, name: str) -> torch.Tensor:
        entry = self.entries[name]
        if entry.end == entry.begin or self._map is None:
            return torch.empty(entry.shape, dtype=entry.dtype)
        flat = torch.frombuffer(
            self._map, dtype=torch.uint8, count=entry.end - entry.begin, offset=self.data_start + entry.begin
        )
        return flat.view(entry.dtype).view(entry.shape)


def _pt_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise EngramError(
            f"{path}: holds pickled objects other than tensors, refused (weights_only): {first}"
        ) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, ValueError) as exc:
        raise EngramError(
            f"{path}: not a readable .pt checkpoint (truncated or corrupt): {str(exc).strip().splitlines()[0]}"
        ) from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise EngramError(f"{path}: a .pt checkpoint must hold a dict of name -> tensor")
    return loaded


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class Checkpoint:
    """Every tensor of a checkpoint file or directory (*.safetensors, *.pt, *.bin), opened lazily."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        root = Path(path)
        if root.is_dir():
            files = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".pt", ".bin"))
        elif root.exists():
            files = [root]
        else:
            raise EngramError(f"checkpoint {root} does not exist")
        if not files:
            raise EngramError(f"checkpoint directory {root} holds no *.safetensors, *.pt or *.bin file")
        self.sources: dict[str, Callable[[], torch.Tensor]] = {}
        self.shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.files: dict[str, SafetensorsFile] = {}  # tensors that can be read with pread
        for file in files:
            if file.suffix == ".safetensors":
                st = SafetensorsFile(file)
                for name, entry in st.entries.items():
                    self._add(name, file, entry.shape, entry.dtype, functools.partial(st.tensor, name))
                    self.files[name] = st
            else:
                for name, tensor in _pt_tensors(file).items():
                    self._add(name, file, tuple(tensor.shape), tensor.dtype, functools.partial(_same, tensor))

    def _add(
        self, name: str, file: Path, shape: tuple[int, ...], dtype: torch.dtype, get: Callable[[], torch.Tensor]
    ) -> None:
        if name in self.sources:
            raise EngramError(f"tensor {name!r} appears twice in the checkpoint (again in {file})")
        self.sources[name] = get
        self.shapes[name] = (shape, dtype)


def expected_tensors(shard: TableShard, table_rows: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    fmt = shard.format
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
        f"{shard.name}.weight": ((table_rows, fmt.dim), WEIGHT_DTYPES[fmt.dtype])
    }
    if fmt.scaled:
        out[f"{shard.name}.scale"] = ((table_rows, fmt.dim // 32), SCALE_DTYPE)
    return out


def shard_weight_loader(
    shard: TableShard,
    tensor: str,
    group: Group | None,
    on_bytes: Callable[[int], None] | None = None,
    source: SafetensorsFile | None = None,
) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The weight loader of a shard's parameters: narrow the checkpoint tensor to the owned rows and copy.
    With a shared table only the group's leader copies, and every rank meets at a barrier after each
    call, so when the last call returns the table is complete everywhere. With `source`, the file the
    tensor lives in, host rows are read straight from the file instead of through its mapping."""

    def load(param: torch.Tensor, loaded: torch.Tensor) -> None:
        rows = loaded[shard.row_start : shard.row_stop]
        if (
            (group is None or group.rank == 0)
            and source is not None
            and param.device.type == "cpu"
            and param.is_contiguous()
        ):
            source.read_rows(tensor, shard.row_start, param.data, on_bytes)
        elif group is None or group.rank == 0:
            step = max(1, COPY_CHUNK // max(1, rows[:1].numel() * rows.element_size()))
            for start in range(0, rows.shape[0], step):
                part = rows[start : start + step]
                param.data[start : start + step].copy_(part)
                if on_bytes is not None:
                    on_bytes(part.numel() * part.element_size())
        if group is not None:
            barrier(group, f"load {tensor}")

    return load


def load_shards(
    shards: list[TableShard],
    table_rows: dict[str, int],
    checkpoint: Checkpoint,
    *,
    group: Group | None = None,
    progress: bool = True,
    on_bytes: Callable[[int], None] | None = None,
) -> int:
    """Load every shard from `checkpoint`; returns the bytes copied here. Shapes and dtypes of every
    tensor are checked against the tables before the first byte moves. A progress bar (bytes, rate,
    time left) appears for loads that take over a second; `on_bytes` hears of every chunk copied."""
    wanted: dict[str, tuple[TableShard, str]] = {}
    problems = []
    for shard in shards:
        for name, (shape, dtype) in expected_tensors(shard, table_rows[shard.name]).items():
            wanted[name] = (shard, name.rsplit(".", 1)[1])
            if name not in checkpoint.shapes:
                problems.append(f"{name} is missing")
                continue
            got_shape, got_dtype = checkpoint.shapes[name]
            if got_shape != shape:
                problems.append(f"{name} has shape {list(got_shape)}, the model needs {list(shape)}")
            elif got_dtype != dtype:
                problems.append(f"{name} has dtype {got_dtype}, the model needs {dtype}")
    if problems:
        raise EngramError("checkpoint does not match the model: " + "; ".join(problems))
    writer = group is None or group.rank == 0
    total = sum(s.format.nbytes for s in shards) if writer else 0
    copied = 0
    bar_options = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "desc": "engram tables", "delay": 1.0}
    with tqdm(total=total, disable=not (progress and writer), **bar_options) as bar:

        def count(n: int) -> None:
            bar.update(n)
            if on_bytes is not None:
                on_bytes(n)

        for name in sorted(wanted):  # the same calls in the same order on every rank
            shard, part = wanted[name]
            param = shard.weight if part == "weight" else shard.scale
            assert param is not None
            shard_weight_loader(shard, name, group, count, checkpoint.files.get(name))(
                param, checkpoint.sources[name]()
            )
            copied += param.numel() * param.element_size() if writer else 0
    return copied
