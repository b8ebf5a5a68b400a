"""One way to draw a command's --plot: the path checked before any work, matplotlib (the optional
`plot` extra) imported on demand, the figure saved and closed whatever happens, every failure one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engram.errors import EngramError


def check_output_path(flag: str, path: str | Path, example: str) -> None:
    """A file a command will write, checked before the work that produces it: not a directory, and in one
    that exists (`example` names a file to suggest)."""
    target = Path(path)
    if target.is_dir():
        raise EngramError(f"{flag} {path} is a directory; name a file, e.g. {target / example}")
    if not target.parent.is_dir():
        raise EngramError(f"{flag} {path}: the directory {target.parent} does not exist; create it or choose another")


def check_plot_path(path: str) -> None:
    check_output_path("--plot", path, "plan.png")


@contextlib.contextmanager
def figure(path: str) -> Iterator[Any]:
    """Axes of a 7 x 4.5 inch figure, saved to `path` when the block ends."""
    check_plot_path(path)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise EngramError("--plot needs matplotlib: pip install 'engram[plot]'") from None
    fig, axes = plt.subplots(figsize=(7, 4.5), dpi=120)
    try:
        yield axes
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
        fig.tight_layout()
        fig.savefig(path)
    except (OSError, ValueError) as exc:
        raise EngramError(f"cannot write the plot to {path}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        plt.close(fig)
