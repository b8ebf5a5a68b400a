"""What a table's rows hold, named by their bytes: node copies are found by these digests, not by where the
files are (pods that mount one model as a hostPath, as a volume seen under another device number, or as
files copied into volumes of their own all find one copy; a file that differs in one byte, or one with
an equal header and other data, finds none of theirs).

A digest is SHA-256 over the SHA-256 of each 64 MiB chunk of the byte range (chunks hashed on several
threads; hashlib lets go of the GIL), so hashing runs at the disk's speed. It is kept per file version
(device, inode, size and times: any rewrite changes the ctime, which no one but root can set) in a
directory of ours (engram.user_cache's checks: ours, writable by no one else, no link followed), so a
file's rows are read for it once per version and store."""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from engram.errors import EngramError
from engram.runtime.checkpoints.files import open_regular
from engram.runtime.checkpoints.loader import Checkpoint, expected_parts, table_pieces, table_scale_tensor
from engram.runtime.shard import ShardFormat
from engram.user_cache import read_cached, save_cached

CHUNK = 64 << 20
THREADS = max(1, min(8, os.cpu_count() or 1))
ENTRY_LIMIT = 4096  # bytes of one stored digest: its key and its hex


def identity(path: Path) -> dict[str, Any]:
    """What names a file's version without reading it."""
    info = os.stat(path)
    return {
        "dev": info.st_dev, "ino": info.st_ino, "size": info.st_size,
        "mtime_ns": info.st_mtime_ns, "ctime_ns": info.st_ctime_ns,
    }  # fmt: skip


def range_digest(path: Path, offset: int, length: int) -> str:
    """The digest (module docstring) of bytes [offset, offset + length) of `path`."""
    fd = open_regular(path, "checkpoint file")

    def chunk(at: int) -> bytes:
        digest, left, where = hashlib.sha256(), min(CHUNK, offset + length - at), at
        while left:
            block = os.pread(fd, min(left, 8 << 20), where)
            if not block:
                raise EngramError(f"checkpoint file {path} ends before byte {offset + length:,}: it shrank")
            digest.update(block)
            left, where = left - len(block), where + len(block)
        return digest.digest()

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            parts = list(pool.map(chunk, range(offset, offset + length, CHUNK)))
    except OSError as exc:
        raise EngramError(f"checkpoint file {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    whole = hashlib.sha256(f"{length}:".encode())
    for part in parts:
        whole.update(part)
    return whole.hexdigest()


def stored_digest(store: Path | None, path: Path, offset: int, length: int) -> str:
    """range_digest of `path`, kept in the directory `store` per file version (None: not kept)."""
    key = {"file": identity(path), "offset": offset, "length": length}
    if store is None:
        return range_digest(path, offset, length)
    entry = store / f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:48]}.json"

    def load(f: Any) -> str | None:
        told = json.loads(f.read(ENTRY_LIMIT))
        return str(told["digest"]) if told.get("key") == key and len(str(told.get("digest"))) == 64 else None

    found = read_cached(entry, load)
    if found is not None:
        return found
    digest = range_digest(path, offset, length)
    if identity(path) != key["file"]:
        raise EngramError(f"checkpoint file {path} changed while its rows were read; load again once it is written")
    told = json.dumps({"key": key, "digest": digest}).encode()

    def write(f: Any) -> None:
        f.write(told)

    save_cached(entry, write)
    return digest


def rows_digests(
    checkpoint: Checkpoint, table: str, fmt: ShardFormat, row_start: int, table_rows: int, store: Path | None
) -> list[list[Any]]:
    """[tensor, first row, end row, digest] for each piece of rows [row_start, row_start + fmt.rows) of
    `table`'s row tensors (weight, block scales; whole or in shard_<k> parts), and its table scale: the
    bytes a copy of these rows holds. A tensor of a file that is not safetensors is hashed as loaded."""
    found: list[list[Any]] = []
    row_stop = row_start + fmt.rows
    for suffix, width, dtype in expected_parts(fmt).values():
        pieces, _ = table_pieces(
            checkpoint.shapes, table, suffix, table_rows, width, dtype
        )  # the loader words problems
        row_bytes = width * dtype.itemsize
        for piece in pieces:
            lo, hi = max(row_start, piece.start), min(row_stop, piece.start + piece.rows)
            if lo < hi:
                found.append(
                    [
                        piece.tensor,
                        lo,
                        hi,
                        _digest(checkpoint, piece.tensor, lo - piece.start, hi - piece.start, row_bytes, store),
                    ]
                )
    scale, _ = table_scale_tensor(checkpoint, table, fmt)
    if scale is not None and scale in checkpoint.shapes:
        found.append([scale, 0, 1, _digest(checkpoint, scale, 0, 1, 4, store)])
    return found


def _digest(checkpoint: Checkpoint, tensor: str, lo: int, hi: int, row_bytes: int, store: Path | None) -> str:
    """The digest of rows [lo, hi) of `tensor` (of `row_bytes` each), as stored."""
    file = checkpoint.files.get(tensor)
    if file is not None:
        entry = file.entries[tensor]
        return stored_digest(store, file.path, file.data_start + entry.begin + lo * row_bytes, (hi - lo) * row_bytes)
    held = checkpoint.sources[tensor]().reshape(-1).view(torch.uint8)[lo * row_bytes : hi * row_bytes]
    return hashlib.sha256(held.contiguous().numpy().tobytes()).hexdigest()
