"""What happened to the files behind a file-backed shard since they were mapped, always asked of the inode
mapped (its descriptor), never of whatever the name holds by then: shrunk (a read past the new end faults,
and the guarded kernel's error is raised naming the file), rewritten in place (`cp new old`: a tier's rows
copied from it are stale), or open for writing by another process now."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from engram.errors import EngramError
from engram.memory.mapping import Mapping
from engram.runtime.checkpoints.files import open_for_writing
from engram.runtime.shard import TableShard


def _stat(mapping: Mapping) -> os.stat_result:
    try:
        return os.fstat(mapping.fd if mapping.fd is not None else -1)
    except OSError as exc:
        raise EngramError(
            f"{mapping.path}: the file-backed checkpoint cannot be read any more: {exc.strerror}"
        ) from None


def check_files(shard: TableShard) -> None:
    """Raise, naming the file, when a file behind a file-backed shard shrank since it was mapped (a read
    past its new end faulted; the guarded kernel turned that into an error). Asked of the inode mapped:
    a file renamed over it or unlinked leaves the mapped one as it was."""
    for mapping in shard.files:
        size = _stat(mapping).st_size
        if size < mapping.size:
            raise EngramError(
                f"{mapping.path}: truncated at offset {size:,}: the checkpoint shrank from {mapping.size:,} bytes while its tables "
                "were mapped; restore the file and restart the engine"
            )


def file_stamp(mapping: Mapping) -> tuple[int, int, int]:
    """The mapped file's (size, mtime_ns, ctime_ns) now: any rewrite in place changes one of them."""
    info = _stat(mapping)
    return info.st_size, info.st_mtime_ns, info.st_ctime_ns


def rewritten(shard: TableShard) -> list[str]:
    """The files behind a file-backed shard rewritten in place since this shard last took their pages as
    the table's (file_stamps: size, mtime or ctime of the mapped inode changed: `cp new old`), each now
    taken as it is. Rows copied out of them before (a tier's) are stale. Every shard of a file keeps its
    own stamps, so each notices every rewrite."""
    changed = []
    for at, mapping in enumerate(shard.files):
        stamp = file_stamp(mapping)
        if stamp != shard.file_stamps[at]:
            shard.file_stamps[at] = stamp
            changed.append(mapping.path or "a checkpoint file")
    return changed


def being_written(shard: TableShard) -> list[str] | None:
    """The files behind a file-backed shard that a process (in any namespace) has open for writing or
    mapped writable now (open_for_writing): its writes through a mapping reach the rows without changing
    the file's times. None where that cannot be asked of a file."""
    found: list[str] = []
    for mapping in shard.files:
        writing = open_for_writing(mapping.fd if mapping.fd is not None else -1)
        if writing is None:
            return None
        if writing:
            found.append(mapping.path or "a checkpoint file")
    return found


@contextlib.contextmanager
def files_named_on_fault(shard: TableShard) -> Iterator[None]:
    """Reads of `shard` inside: a read that faulted because a file behind a file-backed shard shrank is
    raised as the error naming that file (check_files); any other error passes unchanged."""
    try:
        yield
    except EngramError:
        if shard.files:
            check_files(shard)
        raise
