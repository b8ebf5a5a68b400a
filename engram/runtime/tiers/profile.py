"""A profile of real text (`engram profile --out`): the hot rows per table, most frequent first, and how
often it saw each; a tier's warm start, or with cache_admission "static" all it ever holds."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engram.errors import EngramError
from engram.runtime.checkpoints.files import check_regular
from engram.runtime.checkpoints.loader import SafetensorsFile


class Profile(dict[str, torch.Tensor]):
    """The hot rows per table of a profile (most frequent first), and in `counts` how often it saw each."""

    def __init__(self, rows: dict[str, torch.Tensor], counts: dict[str, torch.Tensor]) -> None:
        super().__init__(rows)
        self.counts = counts


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """The hot rows per table ('<table>.hot_rows', most frequent first) of an `engram profile --out` file,
    and their counts ('<table>.hot_counts'), read into private memory: never a view of a mapping of the
    file, which a rewrite under a running engine would turn into SIGBUS."""
    where = Path(path)
    check_regular(where, "the profile")  # a FIFO or a missing file, named as such
    try:
        file = SafetensorsFile(where)
        parts = {
            suffix: {n.removesuffix(suffix): file.tensor(n) for n in file.entries if n.endswith(suffix)}
            for suffix in (".hot_rows", ".hot_counts")
        }
        return Profile(parts[".hot_rows"], parts[".hot_counts"])
    except EngramError as exc:
        raise EngramError(f"cannot read the profile {exc}; write one with `engram profile --out`") from None
    except (MemoryError, RuntimeError) as exc:  # a header claiming more rows than memory holds
        raise EngramError(
            f"cannot read the profile {where}: its hot rows do not fit in this process's memory "
            f"({str(exc).splitlines()[0][:120]}); write a smaller one with `engram profile --out`"
        ) from None
