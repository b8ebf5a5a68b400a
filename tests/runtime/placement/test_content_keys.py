"""Node copies are found by what they hold: the same rows in files copied elsewhere (another directory,
another filesystem and device number) find the copy; a checkpoint changed in one byte of a table, or one
with an equal header and other data, finds none and loads its own, whose rows equal its own file. The
rows' digests are kept per file version, so a start reads them once."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.runtime.checkpoints import content
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.placement.node_copy import share_key
from engram.runtime.shard import ShardFormat
from tests.runtime.placement.test_node_sharing import Engine, expected_digests
from tests.runtime.specs import SMALL

ROWS = 96


@pytest.fixture
def elsewhere(small_checkpoint: Path) -> Iterator[Path]:
    """The small checkpoint's files copied onto /dev/shm: other inodes, another filesystem's device number."""
    copy = Path("/dev/shm") / f"engram-test-copied-{os.getpid()}"
    shutil.copytree(small_checkpoint, copy)
    yield copy
    shutil.rmtree(copy)


def data_byte(path: Path, table: str) -> int:
    """The file offset of the first byte of `table`'s weight rows."""
    found = Checkpoint(path.parent).files[f"{table}.weight"]
    return found.data_start + found.entries[f"{table}.weight"].begin


@pytest.mark.slow
def test_the_same_rows_in_files_copied_elsewhere_find_the_copy(
    checkpoint: Path, elsewhere: Path, tmp_path: Path
) -> None:
    ours, theirs = (next(c.glob("*.safetensors")).stat() for c in (checkpoint, elsewhere))
    assert (ours.st_dev, ours.st_ino) != (theirs.st_dev, theirs.st_ino)  # another file, wherever /tmp is
    first = Engine(checkpoint, tmp_path / "first", rows=ROWS)
    loaded = first.ready()
    second = Engine(elsewhere, tmp_path / "second", rows=ROWS)
    attached = second.ready()
    second.finish()
    first.finish()
    assert attached["origins"] == {name: ["attached", loaded["pid"]] for name in SMALL.table_names()}
    assert attached["digests"] == loaded["digests"] == expected_digests(elsewhere, ROWS)


@pytest.mark.slow
def test_a_checkpoint_changed_in_one_byte_loads_its_own(checkpoint: Path, elsewhere: Path, tmp_path: Path) -> None:
    table = SMALL.table_names()[0]
    model = next(elsewhere.glob("*.safetensors"))
    at = data_byte(model, table) + 5
    with open(model, "r+b") as f:  # one byte of one row, header and size unchanged
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    first = Engine(checkpoint, tmp_path / "first", rows=ROWS)
    loaded = first.ready()
    second = Engine(elsewhere, tmp_path / "second", rows=ROWS)
    report = second.ready()
    second.finish()
    first.finish()
    assert report["origins"][table] == ["loaded", report["pid"]]
    others = [n for n in SMALL.table_names() if n != table]  # the tables it did not change are still one copy
    assert all(report["origins"][n] == ["attached", loaded["pid"]] for n in others)
    assert report["digests"] == expected_digests(elsewhere, ROWS) and loaded["digests"] == expected_digests(
        checkpoint, ROWS
    )
    assert report["digests"][table] != loaded["digests"][table]


@pytest.mark.slow
def test_equal_headers_with_other_data_share_nothing(checkpoint: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_checkpoint(SMALL, other, seed=8)  # the same names, shapes, dtypes and sizes: another draw of rows
    first = Engine(checkpoint, tmp_path / "first", rows=ROWS)
    first.ready()
    second = Engine(other, tmp_path / "second", rows=ROWS)
    report = second.ready()
    second.finish()
    first.finish()
    assert report["origins"] == {name: ["loaded", report["pid"]] for name in SMALL.table_names()}
    assert report["digests"] == expected_digests(other, ROWS)


def test_digests_are_kept_per_file_version(
    small_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(small_checkpoint, copy)
    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(tmp_path / "cache"))
    table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
    fmt = ShardFormat(ROWS, SMALL.head_dim, SMALL.dtype)
    read: list[tuple[int, int]] = []
    theirs = content.range_digest

    def counted(path: Path, offset: int, length: int) -> str:
        read.append((offset, length))
        return theirs(path, offset, length)

    monkeypatch.setattr(content, "range_digest", counted)
    key = share_key(Checkpoint(copy), table, rows, 0, fmt, None)
    assert len(read) == 2  # the weight rows and their block scales
    assert share_key(Checkpoint(copy), table, rows, 0, fmt, None) == key and len(read) == 2  # kept
    model = next(copy.glob("*.safetensors"))
    os.utime(model)  # a new version of the file (its times): read again, and the same bytes are the same key
    assert share_key(Checkpoint(copy), table, rows, 0, fmt, None) == key and len(read) == 4
    expected = hashlib.sha256(f"{ROWS * SMALL.head_dim}:".encode())
    offset = data_byte(model, table)
    with open(model, "rb") as f:
        f.seek(offset)
        expected.update(hashlib.sha256(f.read(ROWS * SMALL.head_dim)).digest())
    assert read[0] == (offset, ROWS * SMALL.head_dim)
    assert content.range_digest(model, offset, ROWS * SMALL.head_dim) == expected.hexdigest()  # the scheme, by hand
