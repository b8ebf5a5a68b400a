"""Side-by-side timing helpers shared by the benchmark scripts: medians of repeated runs, one process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], *, number: int, repeat: int = 7) -> float:
    """Median over `repeat` runs of the time per call, each run making `number` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def interleaved_medians(fns: list[Callable[[], object]], *, repeat: int = 15) -> list[float]:
    """Median seconds of each fn, the calls taken in turn (a, b, a, b, ...): on a shared, noisy machine
    each round sees the same conditions, so their ratio holds from run to run where separate medians
    drift apart."""
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, times in zip(fns, runs, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in runs]


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
