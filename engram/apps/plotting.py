"""One way to draw a command's --plot: the path checked before any work, matplotlib (the optional
`plot` extra) imported on demand, the figure saved and closed whatever happens, every failure one line."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import Any

from engram.errors import EngramError
from engram.output_files import check_output_path, write_output


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
        image = io.BytesIO()
        fig.savefig(image, format="png")
        write_output("--plot", path, image.getvalue())
    except (OSError, ValueError) as exc:
        raise EngramError(f"cannot write the plot to {path}: {getattr(exc, 'strerror', None) or exc}") from None
    finally:
        plt.close(fig)
