"""Checkpoint loading into table shards through per-parameter weight loaders `(param, loaded_tensor)`.

safetensors files are read, never mapped here (a file truncated under a mapping kills the reader with
SIGBUS; file-backed tables map theirs in runtime/placement/filemap.py, their reads guarded): a shard's rows are read with pread straight into the table, or through a staging buffer for a GPU table,
so a file that shrinks gives a clear error. Headers are validated before any byte is copied: every
tensor's shape, dtype and byte range, and the ranges tiling the data region exactly (as the safetensors
library requires: no overlap, no gap). `.pt` files load with weights_only=True (pickled objects other
than tensors are refused); every record's CRC-32 is verified and every tensor's storage must hold its
shape, since torch.load(mmap=True) checks neither. Only regular files are opened (never a FIFO).
"""

from __future__ import annotations

import functools
import os
import pickle
import threading
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch
from tqdm import tqdm

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.checkpoints.digests import verify_files
from engram.runtime.checkpoints.files import check_regular, open_regular
from engram.runtime.dist import Group, barrier
from engram.runtime.shard import ShardFormat, TableShard

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
SHOWN_PROBLEMS = 3  # wrong parts named in a refusal; the others are counted
COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class TensorEntry:
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """A validated safetensors file; its rows are read with pread (tensor() copies one into private memory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with os.fdopen(open_regular(path, "checkpoint file"), "rb") as f:
            info = os.fstat(f.fileno())
            size = info.st_size
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
            raise self._error(f"header is not valid JSON: {str(exc)[:200]}") from None
        except RecursionError:
            raise self._error("header nests too deeply to be a safetensors header") from None
        if not isinstance(header, dict):
            raise self._error("header is not a JSON object")
        self.data_start = 8 + header_len
        data_len = size - self.data_start
        self.entries = {
            name: self._entry(name, spec, data_len) for name, spec in header.items() if name != "__metadata__"
        }
        self._check_tiling(data_len)
        self.identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)

    def _check_tiling(self, data_len: int) -> None:
        """The tensors' byte ranges, in order, must cover the data region exactly: overlapping tensors
        would load as each other's bytes, and the official library refuses such a file too."""
        at = 0
        for name, entry in sorted(self.entries.items(), key=lambda item: (item[1].begin, item[1].end)):
            if entry.begin != at:
                kind = (
                    "overlaps the tensor before it"
                    if entry.begin < at
                    else f"leaves bytes {at:,}..{entry.begin:,} unclaimed"
                )
                raise self._error(
                    f"tensor {name!r} at data_offsets [{entry.begin}, {entry.end}] {kind}: invalid offsets"
                )
            at = entry.end
        if at != data_len:
            raise self._error(
                f"the tensors end at data byte {at:,} but the data region holds {data_len:,}: invalid offsets"
            )

    def _error(self, message: str) -> EngramError:
        return EngramError(f"{self.path}: {message}")

    def _entry(self, name: str, spec: Any, data_len: int) -> TensorEntry:
        if not isinstance(spec, dict) or not {"dtype", "shape", "data_offsets"} <= spec.keys():
            raise self._error(f"tensor {name!r}: header entry needs dtype, shape and data_offsets")
        dtype = SAFETENSORS_DTYPES.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
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
        """Rows [start, start + len(out)) of tensor `name` into `out` with pread: straight into a
        contiguous CPU tensor (the page cache is copied once), through a staging buffer otherwise (a GPU
        table). A file that shrank or was replaced since it was opened is an error, never a signal."""
        entry = self.entries[name]
        if out.dtype != entry.dtype or tuple(out.shape[1:]) != entry.shape[1:]:
            raise self._error(
                f"tensor {name!r} is {entry.dtype} {list(entry.shape)}; cannot read it into {out.dtype} {list(out.shape)}"
            )
        row_bytes = out[:1].numel() * out.element_size() if out.dim() else out.element_size()
        offset = self.data_start + entry.begin + start * row_bytes
        if offset + out.numel() * out.element_size() > self.data_start + entry.end:
            raise self._error(
                f"rows [{start}, {start + len(out)}) lie outside tensor {name!r} of {entry.shape[0]} rows"
            )
        if not out.is_contiguous():
            raise self._error(f"tensor {name!r}: rows are read into contiguous tensors only")
        flat = out.view(torch.uint8).view(-1)
        direct = out.device.type == "cpu"
        staging = flat if direct else torch.empty(min(COPY_CHUNK, flat.numel()), dtype=torch.uint8)
        with os.fdopen(open_regular(self.path, "checkpoint file"), "rb", buffering=0) as f:
            info = os.fstat(f.fileno())
            if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns) != self.identity:
                raise self._error("the file changed since it was opened (replaced, truncated or rewritten); load again")
            done = 0
            while done < flat.numel():
                piece = min(COPY_CHUNK, flat.numel() - done)
                target = staging[done : done + piece] if direct else staging[:piece]
                if _pread_full(f.fileno(), target, offset + done) < piece:
                    raise self._error(f"tensor {name!r} ended early: the file shrank while loading")
                if not direct:
                    flat[done : done + piece].copy_(target)
                done += piece
                if on_bytes is not None:
                    on_bytes(piece)

    def tensor(self, name: str) -> torch.Tensor:
        """The whole tensor, read into private memory (never a view of a mapping of the file)."""
        entry = self.entries[name]
        out = torch.empty(entry.shape, dtype=entry.dtype)
        if out.numel():
            self.read_rows(name, 0, out if out.dim() else out.view(1))
        return out


def _pread_full(fd: int, target: torch.Tensor, offset: int) -> int:
    """Bytes read into `target` (contiguous uint8) at `offset`; fewer only at the end of the file."""
    view = memoryview(target.numpy())  # type: ignore[arg-type]
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _pt_records(path: Path) -> list[int]:
    """The byte sizes of the tensor data records, in file order, after every record's CRC-32 is checked
    (the zip format carries one: a flipped byte would otherwise load as a different row)."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
            records = sorted(
                (info.header_offset, info.file_size)
                for info in archive.infolist()
                if info.filename.split("/")[-2:-1] == ["data"]
            )
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise EngramError(f"{path}: not a readable .pt checkpoint (truncated or corrupt): {str(exc)[:200]}") from None
    if bad is not None:
        raise EngramError(f"{path}: record {bad!r} fails its CRC-32 check: the file is corrupt")
    return [size for _, size in records]


def _check_pt_tensors(path: Path, loaded: dict[str, torch.Tensor], records: list[int]) -> None:
    """Dense CPU tensors whose storages are exactly their records: torch.load(mmap=True) takes a storage's
    size from the pickle, not from its record, so a short record would read past it. The file is mapped
    whole, so storages in address order are the records in file order."""
    for name, tensor in loaded.items():
        if tensor.layout != torch.strided or tensor.device.type != "cpu":
            raise EngramError(
                f"{path}: tensor {name!r} is {tensor.layout} on {tensor.device}; a checkpoint holds dense CPU tensors"
            )
    storages = sorted({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in loaded.values()}.items())
    sizes = [nbytes for _, nbytes in storages]
    if sizes != records:
        raise EngramError(
            f"{path}: the tensors' storages ({len(sizes)}, {sum(sizes):,} bytes) do not match the data records ({len(records)}, {sum(records):,} bytes): the file is corrupt"
        )


def _pt_tensors(path: Path) -> dict[str, torch.Tensor]:
    records = _pt_records(path)
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0]
        raise EngramError(
            f"{path}: holds pickled objects other than tensors, refused (weights_only): {first}"
        ) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, ValueError, NotImplementedError, OSError) as exc:
        raise EngramError(
            f"{path}: not a readable .pt checkpoint (truncated or corrupt): {str(exc).strip().splitlines()[0]}"
        ) from None
    if not isinstance(loaded, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in loaded.items()
    ):
        raise EngramError(f"{path}: a .pt checkpoint must hold a dict of name -> tensor")
    _check_pt_tensors(path, loaded, records)
    return loaded


class Progress(tqdm):  # type: ignore[misc]
    """tqdm with a thread lock of its own. tqdm's default lock includes a multiprocessing RLock, which in a
    spawned process (every replica) is a named POSIX semaphore, /dev/shm/sem.mp-*, removed only by
    multiprocessing's resource tracker at exit: a process group killed with SIGKILL (tracker included)
    left one per replica behind. A bar is only ever updated by the thread that made it."""


Progress.set_lock(threading.RLock())


def _is_safetensors(file: Path) -> bool:
    """By its suffix, or for a file named otherwise, by its first bytes: an 8-byte header length, then the
    header's '{' (a .pt file is a zip archive or a pickle)."""
    if file.suffix in (".safetensors", ".pt", ".bin"):
        return file.suffix == ".safetensors"
    try:
        with os.fdopen(open_regular(file, "checkpoint file"), "rb") as f:
            head = f.read(9)
    except OSError as exc:
        raise EngramError(f"checkpoint file {file} cannot be read: {exc.strerror}") from None
    return len(head) == 9 and head[8:9] == b"{"


def _same(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


class Checkpoint:
    """Every tensor of a checkpoint file or directory (*.safetensors, *.pt, *.bin), opened lazily."""

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        """`verify`: check every file's sha256 against the SHA256SUMS beside it first (digests.py says
        what each format detects without it)."""
        root = Path(path)
        try:
            if root.is_dir():
                files = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".pt", ".bin"))
            elif root.exists() or root.is_symlink():
                files = [root]
            else:
                raise EngramError(f"checkpoint {str(root)[:300]} does not exist")
        except OSError as exc:
            raise EngramError(f"checkpoint {str(root)[:300]} cannot be read: {exc.strerror}") from None
        if not files:
            raise EngramError(f"checkpoint directory {root} holds no *.safetensors, *.pt or *.bin file")
        self._read(files)
        if verify:  # after every header checked: a bogus one fails before gigabytes are hashed
            verify_files(files[0].parent, files)

    @classmethod
    def of_files(cls, files: list[Path]) -> Checkpoint:
        """A checkpoint of exactly `files` (a node agent's: the files an engine passed it, as
        /proc/self/fd/N, each the file the engine opened whatever its name is now)."""
        found = cls.__new__(cls)
        found._read(files)
        return found

    def _read(self, files: list[Path]) -> None:
        """Every tensor of `files`, their headers checked."""
        for file in files:
            check_regular(file, "checkpoint file")
        self.paths = files
        self.sources: dict[str, Callable[[], torch.Tensor]] = {}
        self.shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self.tensor_files: dict[str, Path] = {}  # the file each tensor is in
        self.files: dict[str, SafetensorsFile] = {}  # tensors that can be read with pread
        for file in files:
            if _is_safetensors(file):
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
        self.tensor_files[name] = file


def expected_parts(fmt: ShardFormat) -> dict[str, tuple[str, int, torch.dtype]]:
    """A table's row tensors in the checkpoint, by part ("weight", "scale"): suffix, width and dtype."""
    f = fmt.row_format
    out = {"weight": ("weight", fmt.weight_shape[1], f.weight)}
    if f.scale is not None:
        out["scale"] = (f.scale_name, fmt.scale_shape[1], f.scale)
    return out


def table_scale_tensor(checkpoint: Checkpoint, table: str, fmt: ShardFormat) -> tuple[str | None, str | None]:
    """(name, problem) of a table's scale in the checkpoint: float32, of shape [] or [1] (vLLM's per-tensor
    scale loader takes both); (None, None) for formats without one."""
    f = fmt.row_format
    if not f.table_scale:
        return None, None
    name = f"{table}.{f.table_scale_name}"
    if name not in checkpoint.shapes:
        return name, f"{name} is missing: the table's {fmt.dtype} rows need their float32 scale"
    shape, dtype = checkpoint.shapes[name]
    if shape not in ((), (1,)) or dtype != torch.float32:
        return name, f"{name} is {dtype} {list(shape)}, the model needs one float32 (shape [] or [1])"
    return name, None


@dataclass(frozen=True)
class Piece:
    """A checkpoint tensor holding rows [start, start + rows) of one part of a table."""

    tensor: str
    start: int
    rows: int


def table_pieces(
    shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
    table: str,
    part: str,
    table_rows: int,
    width: int,
    dtype: torch.dtype,
) -> tuple[list[Piece], list[str]]:
    """Where `part` of `table` lies in a checkpoint, and what is wrong with it: one tensor `{table}.{part}`,
    or vLLM's split (Qwen4Exp's split_ngram_parts) into `{table}.shard_{k}.{part}` of ceil(rows / parts)
    rows each, which must tile the table exactly (vLLM would leave a missing part's rows unset)."""

    def wrong(name: str, rows: int) -> str | None:
        got_shape, got_dtype = shapes[name]
        if got_shape != (rows, width):
            return f"{name} has shape {list(got_shape)}, the model needs {[rows, width]}"
        return f"{name} has dtype {got_dtype}, the model needs {dtype}" if got_dtype != dtype else None

    whole = f"{table}.{part}"
    if whole in shapes:
        problem = wrong(whole, table_rows)
        return [Piece(whole, 0, table_rows)], [problem] if problem else []
    head, tail = f"{table}.shard_", f".{part}"
    split: dict[int, str] = {}
    for name in shapes:
        if not (name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail)):
            continue
        number = name[len(head) : -len(tail)]
        if not (number.isascii() and number.isdigit() and len(number) <= 9):
            return [], [f"{name!a} is not a part name: parts are {head}<k>{tail} with k in ASCII digits"]
        if int(number) in split:  # shard_1 and shard_01: which rows are part 1 would be a guess
            first, second = sorted((split[int(number)], name))
            return [], [f"{first!a} and {second!a} both name part {int(number)} of {whole}; keep one"]
        split[int(number)] = name
    if not split:
        return [], [f"{whole} is missing (nor is it split into {head}<k>{tail} parts)"]
    if 0 not in split:
        return [], [f"{head}0{tail} is missing: the parts of {whole} must start at part 0"]
    first_shape = shapes[split[0]][0]
    if len(first_shape) != 2 or first_shape[1] != width:  # its rows would size every other part
        return [], [f"{split[0]} has shape {list(first_shape)[:8]}; parts are [rows, {width}] tensors"]
    size = first_shape[0]
    if size < 1:
        return [], [f"{split[0]} holds no rows; parts hold ceil(rows / split_ngram_parts) rows each"]
    count = -(-table_rows // size)
    pieces, problems = [], []
    missing = next((k for k in range(min(count, len(split) + 1)) if k not in split), None)  # bounded by the header
    if missing is not None:
        more = count - sum(1 for k in split if k < count) - 1
        also = f" (and {more:,} more)" if more > 0 else ""
        problems.append(
            f"{head}{missing}{tail} is missing{also}: the parts of {size:,} rows must cover all {table_rows:,}"
        )
    wrong_parts = []
    for k in sorted(split):
        rows = max(0, min(size, table_rows - k * size))
        if (problem := wrong(split[k], rows)) is not None:
            wrong_parts.append(problem)
        elif rows:
            pieces.append(Piece(split[k], k * size, rows))
    if len(wrong_parts) > SHOWN_PROBLEMS:
        wrong_parts[SHOWN_PROBLEMS:] = [f"and {len(wrong_parts) - SHOWN_PROBLEMS:,} more parts like these"]
    return pieces, problems + wrong_parts


def stored_rows(
    checkpoint: Checkpoint, shard: TableShard, table_rows: int, part: str, rows: list[int]
) -> torch.Tensor | None:
    """Rows `rows` (global ids of `shard`'s) of its `part` ("weight" or "scale"), as the checkpoint's
    safetensors files store them, read with pread (bytes, [len(rows), row bytes]); None where one lies in
    a file that is not safetensors (a .pt file is read whole, never a row at a time)."""
    suffix, width, dtype = expected_parts(shard.format)[part]
    pieces, _ = table_pieces(checkpoint.shapes, shard.name, suffix, table_rows, width, dtype)
    out = torch.empty((len(rows), width * dtype.itemsize), dtype=torch.uint8)
    for at, row in enumerate(rows):
        piece = next(p for p in pieces if p.start <= row < p.start + p.rows)
        file = checkpoint.files.get(piece.tensor)
        if file is None:
            return None
        file.read_rows(piece.tensor, row - piece.start, out[at : at + 1].view(file.entries[piece.tensor].dtype))
    return out


RAW_BYTES = {torch.uint8, torch.float8_e8m0fnu}


def shard_weight_loader(
    shard: TableShard,
    tensor: str,
    group: Group | None,
    on_bytes: Callable[[int], None] | None = None,
    source: SafetensorsFile | None = None,
) -> Callable[..., None]:
    """The weight loader of a shard's parameters, `(param, loaded, checkpoint_start=0)` as vLLM calls its
    loaders: `loaded` holds the table's rows from `checkpoint_start` on (a whole table, or one of its
    split parts); the rows it shares with the shard are copied. With a shared table only the group's
    leader copies, and every rank meets at a barrier after each call, so when the last call returns the
    table is complete everywhere. With `source`, the file the tensor lives in, and no tensor given
    (loaded=None), those rows are read from the file (pread)."""

    def load(param: torch.Tensor, loaded: torch.Tensor | None, checkpoint_start: int | None = 0) -> None:
        checkpoint_start = checkpoint_start or 0  # vLLM passes None for a whole table
        if loaded is not None:
            if loaded.dim() != 2 or loaded.shape[1] != param.shape[1]:
                raise EngramError(
                    f"{tensor}: the checkpoint's rows {list(loaded.shape)} do not fit the table's {list(param.shape)}"
                )
            if loaded.dtype != param.dtype and {loaded.dtype, param.dtype} <= RAW_BYTES:
                loaded = loaded.view(param.dtype)  # ue8m0 scales held as bytes (vLLM's): copied by their bits
        if shard.placement == "file" or shard.sealed:
            return  # the checkpoint's own read-only pages, or a sealed node copy, loaded already: nothing to copy
        if group is None or group.rank == 0:
            rows = loaded.shape[0] if loaded is not None else source.entries[tensor].shape[0] if source else 0
            first, stop = max(checkpoint_start, shard.row_start), min(checkpoint_start + rows, shard.row_stop)
            target = param.data[first - shard.row_start : stop - shard.row_start]
            if stop <= first:
                pass  # no row of this piece is the shard's
            elif loaded is not None:
                _copy_rows(loaded[first - checkpoint_start : stop - checkpoint_start], target, on_bytes)
            elif source is not None:
                source.read_rows(tensor, first - checkpoint_start, target, on_bytes)
            else:
                raise EngramError(f"{tensor}: no tensor given and no file to read it from")
        if group is not None:
            barrier(group, f"load {tensor}")

    return load


def table_scale_loader(shard: TableShard, tensor: str, group: Group | None) -> Callable[..., None]:
    """The weight loader of a shard's table scale, `(param, loaded)`: one float32 ([] or [1]), written by
    the group's leader only, with the same barrier as the row loaders."""

    def load(param: torch.Tensor, loaded: torch.Tensor) -> None:
        if loaded.numel() != 1 or loaded.dtype != torch.float32:
            raise EngramError(f"{tensor}: a table scale is one float32, got {loaded.dtype} {list(loaded.shape)}")
        if shard.placement != "file" and not shard.sealed and (group is None or group.rank == 0):
            param.data.copy_(loaded.reshape(1))
        if group is not None:
            barrier(group, f"load {tensor}")

    return load


def _copy_rows(rows: torch.Tensor, param: torch.Tensor, on_bytes: Callable[[int], None] | None) -> None:
    step = max(1, COPY_CHUNK // max(1, rows[:1].numel() * rows.element_size()))
    for start in range(0, rows.shape[0], step):
        part = rows[start : start + step]
        param.data[start : start + step].copy_(part)
        if on_bytes is not None:
            on_bytes(part.numel() * part.element_size())


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
    wanted: list[tuple[str, TableShard, str, Piece]] = []
    problems = []
    scales: list[tuple[str, TableShard]] = []
    for shard in shards:
        for part, (suffix, width, dtype) in expected_parts(shard.format).items():
            pieces, found = table_pieces(checkpoint.shapes, shard.name, suffix, table_rows[shard.name], width, dtype)
            problems += found
            wanted += [(piece.tensor, shard, part, piece) for piece in pieces]
        name, problem = table_scale_tensor(checkpoint, shard.name, shard.format)
        problems += [problem] if problem else []
        scales += [(name, shard)] if name and not problem else []
    if problems:
        raise EngramError("checkpoint does not match the model: " + "; ".join(problems))
    writer = group is None or group.rank == 0
    total = sum(s.format.nbytes for s in shards) if writer else 0
    bar_options = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "desc": "engram tables", "delay": 1.0}
    with Progress(total=total, disable=not (progress and writer), **bar_options) as bar:

        def count(n: int) -> None:
            bar.update(n)
            if on_bytes is not None:
                on_bytes(n)

        for name, shard, part, piece in sorted(wanted, key=lambda w: w[0]):  # the same calls on every rank
            param = shard.weight if part == "weight" else shard.scale
            assert param is not None
            source = checkpoint.files.get(name)
            loaded = None if source is not None else checkpoint.sources[name]()  # safetensors: read from the file
            shard_weight_loader(shard, name, group, count, source)(param, loaded, checkpoint_start=piece.start)
        for name, shard in sorted(scales, key=lambda s: s[0]):
            table_scale_loader(shard, name, group)(shard.table_scale, checkpoint.sources[name]())
    return (
        sum(t.numel() * t.element_size() for s in shards for t in (s.weight, s.scale) if t is not None) if writer else 0
    )


def check_hash_buffers(spec: ModelSpec, checkpoint: Checkpoint) -> None:
    """Qwen4Exp checkpoints may carry each PLE layer's hash buffers (vLLM loads `layer_multipliers`,
    `ngram_heads_offsets` and `ngram_heads_vocab_sizes` over the values it derives). engram hashes with the
    values derived from the config, so buffers that differ from them are refused before any table loads:
    served together they would return the wrong rows."""
    if spec.family != "qwen" or spec.ple_tables != "per-layer":
        return
    layout = spec.layout
    layers = len(layout.layer_ids)
    derived = {
        "layer_multipliers": layout.multipliers,
        "ngram_heads_offsets": layout.offsets.reshape(layers, -1),
        "ngram_heads_vocab_sizes": layout.primes.reshape(layers, -1),
    }
    for layer, table in enumerate(spec.table_names()):
        module = table.removesuffix(".ngram_embedding")
        for buffer, values in derived.items():
            name = f"{module}.{buffer}"
            if name not in checkpoint.shapes:
                continue
            shape, _ = checkpoint.shapes[name]
            if shape != values[layer].shape:
                raise EngramError(
                    f"checkpoint's {name} has shape {list(shape)}, the model needs {list(values[layer].shape)}"
                )
            stored = checkpoint.sources[name]().to(torch.int64)
            if stored.tolist() != values[layer].tolist():
                raise EngramError(
                    f"checkpoint's {name} differs from what the config derives (ple_layer_ids, seed, ngram_vocab_size_base, vocab_size): check the config.json beside it"
                )
