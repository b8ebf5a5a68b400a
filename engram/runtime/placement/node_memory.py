"""What both kinds of node-shared table (a memfd, a named file in ENGRAM_SHM_DIR) need: which node this
process is on, the space reserved before any write, and the fence's verdict."""

from __future__ import annotations

import os

from engram.errors import EngramError
from engram.memory.mapping import PAGE, Mapping, round_up
from engram.runtime.dist import Group
from engram.scratch import boot_id

GIB = 1 << 30


def node_of_this_process() -> str:
    """This process's node: ENGRAM_NODE_ID (tests simulate nodes with it), else the boot id."""
    return os.environ.get("ENGRAM_NODE_ID") or boot_id()


def reserve(fd: int, size: int) -> str | None:
    """Allocate every page of a shared table now (a sparse one would die with SIGBUS when memory runs
    out later); None, or why it failed."""
    try:
        os.posix_fallocate(fd, 0, round_up(max(size, 1), PAGE))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def fenced(group: Group, errors: list[str | None], mapping: Mapping | None) -> Mapping:
    """After the fence: this rank's mapping when every rank attached, else one error naming each failure
    (and this rank's mapping released)."""
    failed = [(group.ranks[i], e) for i, e in enumerate(errors) if e]
    if failed:
        if mapping is not None:
            mapping.release()
        raise EngramError(f"{group.label}: " + "; ".join(f"rank {r}: {e}" for r, e in failed))
    assert mapping is not None
    return mapping
