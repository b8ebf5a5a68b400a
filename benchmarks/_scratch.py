"""Scratch directories for the benchmarks' large files (ENGRAM_BENCH_DIR, default /var/tmp, on disk, so
page-cache figures mean something). Each is named for its owner as shared tables are
(engram.runtime.placement.shm.owner_tag), and every benchmark starts by removing those whose owner is
gone: a benchmark killed mid-run leaves its gigabytes only until the next one starts."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from engram.runtime.placement.shm import owner_tag, stale_files


@contextlib.contextmanager
def scratch_dir() -> Iterator[Path]:
    root = Path(os.environ.get("ENGRAM_BENCH_DIR", "/var/tmp"))
    for stale in stale_files(root):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    path = Path(tempfile.mkdtemp(prefix=f"engram-bench-{owner_tag()}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
