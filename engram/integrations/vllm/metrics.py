"""engram's table counters on vLLM's Prometheus endpoint, named in vLLM's style (`vllm:` and snake case;
counters end in `_total` on the wire), labelled by table, tier and the worker's rank:

    vllm:engram_lookups            ids looked up in the table
    vllm:engram_tier_lookups       ids looked up while its tier of hot rows served (= hits + misses)
    vllm:engram_tier_hits          of those, served from the tier
    vllm:engram_tier_misses        of those, read from the table below it
    vllm:engram_tier_admissions    rows copied into the tier
    vllm:engram_tier_evictions     rows it let go
    vllm:engram_tier_bytes_admitted, vllm:engram_tier_bytes_hit, vllm:engram_tier_bytes_missed
    vllm:engram_disk_read_bytes    what a file-backed table's lookups read from storage
    vllm:engram_tier_rows          rows held now (a gauge)

The tables live in vLLM's worker processes and /metrics is served by its API server, so the counters
reach it the way vLLM's own multi-process metrics do: prometheus_client's multiprocess mode, which vLLM
turns on by itself with --api-server-count above 1 and anyone can with PROMETHEUS_MULTIPROC_DIR (set
before `vllm serve`). Published after each refresh of a tier, when its device counters are read anyway
(and every PUBLISH_EVERY lookups of a table without a tier), never inside a CUDA graph capture."""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from engram.runtime.table import Table, Tier

PUBLISH_EVERY = 64
LABELS = ("table", "tier", "rank")
COUNTERS = {
    "engram_lookups": "Row ids looked up in engram's table.",
    "engram_tier_lookups": "Row ids looked up while the table's tier of hot rows served (hits + misses).",
    "engram_tier_hits": "Row ids served from the table's tier of hot rows.",
    "engram_tier_misses": "Row ids the tier of hot rows did not hold, read from the table below it.",
    "engram_tier_admissions": "Rows copied into the tier of hot rows.",
    "engram_tier_evictions": "Rows the tier of hot rows let go.",
    "engram_tier_bytes_admitted": "Bytes of rows copied into the tier of hot rows.",
    "engram_tier_bytes_hit": "Bytes of rows read from the tier of hot rows.",
    "engram_tier_bytes_missed": "Bytes of rows read from the table below the tier, for its misses.",
    "engram_disk_read_bytes": "Bytes a file-backed table's lookups read from storage.",
}


def _figures(table: Table) -> dict[str, int]:
    """The table's counters as the metric names have them, its tiers' summed over every tier it has had
    (Table.tier_counters: reading the present one's waits for its lookups)."""
    out = {"engram_lookups": table.ids, "engram_disk_read_bytes": table.disk_bytes_read}
    tier = table.tier
    if tier is not None:
        out.update({f"engram_tier_{key}": value for key, value in table.tier_counters().items() if key != "refreshes"})
        out["engram_tier_rows"] = tier.admission.used
    return out


@dataclass
class Published:
    """What a table's counters stood at when last published, and its tiers' refreshes and lookups then."""

    figures: dict[str, int] = field(default_factory=dict)
    refreshes: int = 0
    lookups: int = 0
    tier: str | None = None  # its tier's label then: None before the first publish


class Metrics:
    """The process's engram metrics (created on first use: prometheus_client allows each name once)."""

    def __init__(self) -> None:
        self._metrics: dict[str, Any] | None = None
        # by the table itself, weakly: a table built where a freed one was must not inherit its figures
        self._published: weakref.WeakKeyDictionary[Table, Published] = weakref.WeakKeyDictionary()

    def _made(self) -> dict[str, Any]:
        if self._metrics is None:
            from prometheus_client import Counter, Gauge

            made: dict[str, Any] = {name: Counter(f"vllm:{name}", doc, LABELS) for name, doc in COUNTERS.items()}
            made["engram_tier_rows"] = Gauge(
                "vllm:engram_tier_rows", "Rows the tier of hot rows holds now.", LABELS, multiprocess_mode="livesum"
            )
            self._metrics = made
        return self._metrics

    def observe(self, name: str, table: Table, on: torch.device) -> None:
        """After a lookup of `table` (vLLM's name for it, `name`): publish its counters on its first lookup
        with its tier (or none), when its device tier has refreshed since they were last published, or every
        PUBLISH_EVERY lookups of a table with a RAM tier or none (host counters: deciding reads no device
        counter)."""
        seen = self._published.setdefault(table, Published())
        tier = table.tier
        if tier is not None and tier.windowed:
            due = table.refreshes != seen.refreshes
        else:
            due = table.lookups - seen.lookups >= PUBLISH_EVERY
        if (due or seen.tier != tier_label(tier)) and not (
            on.type == "cuda" and torch.cuda.is_current_stream_capturing()
        ):
            self.publish(name, table)

    def publish(self, name: str, table: Table) -> None:
        """Add what `table`'s counters gained since the last publish to the metrics."""
        seen = self._published.setdefault(table, Published())
        figures, tier = _figures(table), table.tier
        labels = (name, tier_label(tier), os.environ.get("RANK", "0"))
        metrics = self._made()
        for key, value in figures.items():
            series = metrics[key].labels(*labels)  # every series is served from the first publish, zeros too
            if key == "engram_tier_rows":
                series.set(value)
            elif value > seen.figures.get(key, 0):
                series.inc(value - seen.figures.get(key, 0))
        seen.figures, seen.lookups, seen.refreshes, seen.tier = figures, table.lookups, table.refreshes, labels[1]


def tier_label(tier: Tier | None) -> str:
    return "none" if tier is None else tier.name


METRICS = Metrics()
