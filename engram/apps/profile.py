"""How Zipfian are a model's n-gram ids on real text? Hash a corpus with the preset's real hasher and
measure, per table and per n-gram order: how many distinct rows the sample touched, and the share of
lookups the most frequent 0.1/1/5/10% of those take (over the rows touched, not the order's rows: a sample
smaller than the table touches few of them, and the top 1% of a table's rows would then take every lookup
whatever the text); the repeat rate within a batch (prefill and decode shapes); and the hit rate of a
device cache of a given byte size whose hot set is chosen on one part of the corpus and measured on the
held-out part, so the figure is honest. The hot rows per table, with their counts, go to a profile file
(safetensors) that a device cache can be loaded from."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.output_files import write_output
from engram.runtime.shard import ShardFormat

TOP_SHARES = (0.001, 0.01, 0.05, 0.1)
BATCHES = {"prefill": 8192, "decode": 256}


@dataclass
class TableProfile:
    table: str
    rows: int
    row_bytes: int
    top_share: dict[str, dict[str, float]] = field(default_factory=dict)  # order -> "top 1%" -> share
    rows_seen: dict[str, int] = field(default_factory=dict)  # order -> distinct rows the fit sample touched
    repeat_rate: dict[str, float] = field(default_factory=dict)  # batch shape -> 1 - distinct / lookups
    hit_rate: dict[int, float] = field(default_factory=dict)  # cache bytes -> held-out hit rate
    hot_rows: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    hot_counts: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))


def _ids(spec: ModelSpec, tokens: torch.Tensor) -> torch.Tensor:
    """Row ids [T, layers, columns] of a token stream, DEAD_ID never (real text has no dead positions)."""
    compressed = spec.compress(tokens) if spec.family == "deepseek" else tokens
    rows: torch.Tensor = spec.hasher().hash(compressed)
    return rows


def top_share(counts: torch.Tensor, share: float) -> float:
    """The share of lookups that the most frequent `share` of the rows seen take (counts: one per row seen)."""
    total = int(counts.sum())
    if total == 0:
        return 0.0
    k = max(1, int(counts.numel() * share))
    return float(torch.sort(counts, descending=True).values[:k].sum()) / total


def repeat_rate(ids: torch.Tensor, batch: int) -> float:
    """Mean over whole batches of `batch` tokens of 1 - distinct ids / ids (ids: [T, columns])."""
    rates = [
        1.0 - torch.unique(ids[start : start + batch]).numel() / ids[start : start + batch].numel()
        for start in range(0, ids.shape[0] - batch + 1, batch)
    ]
    return sum(rates) / len(rates) if rates else 0.0


def hit_rate(hot: torch.Tensor, held_out: torch.Tensor) -> float:
    """Share of held-out lookups whose row is in the hot set."""
    return float(torch.isin(held_out, hot).float().mean()) if held_out.numel() else 0.0


def profile_tables(
    spec: ModelSpec, fit: torch.Tensor, held_out: torch.Tensor, cache_bytes: list[int]
) -> list[TableProfile]:
    """Profiles of every table from a fit token stream and a held-out one."""
    if fit.numel() == 0 or held_out.numel() == 0:
        raise EngramError("profiling needs tokens in both the fit and the held-out part")
    fit_rows, held_rows = _ids(spec, fit), _ids(spec, held_out)
    layout = spec.layout
    heads = layout.heads
    row_bytes = ShardFormat(1, spec.head_dim, spec.dtype).row_bytes
    largest = max(cache_bytes, default=0) // row_bytes
    out = []
    for table, name in enumerate(spec.table_names()):
        layers = [i for i, t in enumerate(layout.table_of_layer) if t == table]
        seen = fit_rows[:, layers].reshape(-1)
        distinct, counts = torch.unique(seen, return_counts=True)
        order = torch.argsort(counts, descending=True, stable=True)
        result = TableProfile(name, layout.table_rows[table], row_bytes)
        for n in range(2, layout.max_ngram + 1):
            columns = slice((n - 2) * heads, (n - 1) * heads)
            _, order_counts = torch.unique(fit_rows[:, layers, columns].reshape(-1), return_counts=True)
            result.rows_seen[str(n)] = order_counts.numel()
            result.top_share[str(n)] = {
                f"top {share:.1%}".replace(".0%", "%"): top_share(order_counts, share) for share in TOP_SHARES
            }
        for shape, batch in BATCHES.items():
            result.repeat_rate[shape] = repeat_rate(fit_rows[:, layers].reshape(fit_rows.shape[0], -1), batch)
        held = held_rows[:, layers].reshape(-1)
        for size in cache_bytes:
            result.hit_rate[size] = hit_rate(distinct[order[: size // row_bytes]], held)
        result.hot_rows, result.hot_counts = distinct[order[:largest]], counts[order[:largest]]
        out.append(result)
    return out


def summary(spec: ModelSpec, profiles: list[TableProfile], fit_tokens: int, held_tokens: int) -> dict[str, Any]:
    return {
        "preset": spec.name,
        "fit_tokens": fit_tokens,
        "held_out_tokens": held_tokens,
        "tables": [
            {
                "table": p.table,
                "rows": p.rows,
                "row_bytes": p.row_bytes,
                "rows_seen_by_order": p.rows_seen,
                "top_share_by_order": p.top_share,
                "repeat_rate": p.repeat_rate,
                "hit_rate_by_cache_bytes": {str(k): v for k, v in p.hit_rate.items()},
                "cache_share_of_table": {str(k): k / (p.rows * p.row_bytes) for k in p.hit_rate},
            }
            for p in profiles
        ],
    }


def write_profile(path: Path, spec: ModelSpec, profiles: list[TableProfile], report: dict[str, Any]) -> None:
    """Hot rows (most frequent first) and their counts per table, with the report as metadata."""
    tensors = {}
    for p in profiles:
        tensors[f"{p.table}.hot_rows"] = p.hot_rows.contiguous()
        tensors[f"{p.table}.hot_counts"] = p.hot_counts.contiguous()
    data = save(tensors, metadata={"engram_profile": json.dumps(report), "preset": spec.name})
    write_output("--out", path, data)
