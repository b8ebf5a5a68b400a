"""Table layouts: bucket sizes (primes), offsets, rows per table, and the hash multipliers, for both
families, bit-exact with DeepSeek V4.1's Engram and vLLM 0.33's Qwen4Exp PLE."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from engram.ngram.primes import primes_above

INT64_MAX = (1 << 63) - 1
MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
Family = Literal["deepseek", "qwen"]


@dataclass(frozen=True, eq=False)
class Layout:
    """Where every head's buckets live. Arrays are indexed [layer position, order n-2, head].

    `offsets` are row offsets inside the table that layer reads (`table_of_layer`): one table per layer
    (DeepSeek, and Qwen as vLLM runs it), or one table for all PLE layers (Qwen's "shared" layout)."""

    family: Family
    layer_ids: tuple[int, ...]
    max_ngram: int
    heads: int
    primes: np.ndarray
    offsets: np.ndarray
    multipliers: np.ndarray  # [layers, max_ngram] int64, odd
    vocab: int  # ids hashed are < vocab (V' for DeepSeek, the raw vocabulary for Qwen)
    table_rows: tuple[int, ...]
    table_of_layer: tuple[int, ...]

    @property
    def columns(self) -> int:
        """Heads per layer over all orders: C = (N-1) * K."""
        return (self.max_ngram - 1) * self.heads

    @property
    def layer_rows(self) -> tuple[int, ...]:
        """Rows of the buckets each layer uses (the sum of its primes)."""
        return tuple(int(r) for r in self.primes.reshape(len(self.layer_ids), -1).sum(axis=1))


def deepseek_primes(layer_ids: tuple[int, ...], max_ngram: int, heads: int, base: tuple[int, ...]) -> np.ndarray:
    """One used-set across layers, orders and heads: for each layer in list order and each order n,
    K times take the smallest unused prime above the running value, starting from base(n) - 1."""
    used: set[int] = set()
    out = np.zeros((len(layer_ids), max_ngram - 1, heads), dtype=np.int64)
    for li in range(len(layer_ids)):
        for n in range(2, max_ngram + 1):
            current = base[n - 2] - 1
            for h in range(heads):
                current = next(p for p in primes_above(current) if p not in used)
                used.add(current)
                out[li, n - 2, h] = current
    return out


def deepseek_multipliers(layer_ids: tuple[int, ...], max_ngram: int, vocab: int, seed: int = 0) -> np.ndarray:
    """Per layer, N odd multipliers drawn with NumPy's PCG64, seeded by the layer id (not its position);
    the bound keeps id * multiplier inside int64 for every compressed id."""
    bound = max(1, (INT64_MAX // vocab) // 2)
    rows = [
        np.random.default_rng(seed + 10007 * layer_id).integers(0, bound, size=max_ngram, dtype=np.int64) * 2 + 1
        for layer_id in layer_ids
    ]
    return np.stack(rows).astype(np.int64)


def deepseek_layout(
    layer_ids: tuple[int, ...], max_ngram: int, heads: int, base: tuple[int, ...], vocab: int, seed: int = 0
) -> Layout:
    primes = deepseek_primes(layer_ids, max_ngram, heads, base)
    flat = primes.reshape(len(layer_ids), -1)
    offsets = (np.cumsum(flat, axis=1) - flat).reshape(primes.shape)
    return Layout(
        family="deepseek",
        layer_ids=layer_ids,
        max_ngram=max_ngram,
        heads=heads,
        primes=primes,
        offsets=offsets,
        multipliers=deepseek_multipliers(layer_ids, max_ngram, vocab, seed),
        vocab=vocab,
        table_rows=tuple(int(r) for r in flat.sum(axis=1)),
        table_of_layer=tuple(range(len(layer_ids))),
    )


def splitmix64(value: int) -> int:
    value = (value + GOLDEN) & MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK64
    return value ^ (value >> 31)


def qwen_multipliers(dense: tuple[int, ...], max_ngram: int, vocab: int, seed: int) -> np.ndarray:
    """One row per PLE layer, seeded by its dense index (`dense`)."""
    half = max(1, (INT64_MAX // vocab) // 2)
    return np.array(
        [
            [2 * (splitmix64((seed + 10007 * i + GOLDEN * (j + 1)) & MASK64) % half) + 1 for j in range(max_ngram)]
            for i in dense
        ],
        dtype=np.int64,
    )


QwenTables = Literal["per-layer", "shared"]


def qwen_layout(
    layer_ids: tuple[int, ...],
    max_ngram: int,
    heads: int,
    base: int,
    vocab: int,
    divisor: int,
    seed: int,
    tables: QwenTables = "per-layer",
) -> Layout:
    """Global head g = i*H + h takes the (g+1)-th prime after base - 1, for the layer's dense index i.

    "per-layer" is how vLLM 0.33 runs Qwen4Exp: i is the layer's position among the sorted ids, and each
    layer has its own table (offsets from 0, rows padded to `divisor`). "shared" keeps one
    table for every PLE layer, as engram's first Qwen4Exp support did: i is the position in the list, and
    the table holds every layer's buckets (cumulative offsets, the total padded). With the ids sorted the two hash alike, up to each table's base."""
    if tables == "per-layer":
        ranks = {layer_id: rank for rank, layer_id in enumerate(sorted(set(layer_ids)))}
        dense = tuple(ranks[layer_id] for layer_id in layer_ids)
    else:
        dense = tuple(range(len(layer_ids)))
    per_layer = (max_ngram - 1) * heads
    walk = primes_above(base - 1)
    globals_ = np.array([next(walk) for _ in range((max(dense) + 1) * per_layer)], dtype=np.int64)
    sizes = globals_.reshape(-1, per_layer)[list(dense)]  # [layers, C]
    primes = sizes.reshape(len(layer_ids), max_ngram - 1, heads)
    if tables == "per-layer":
        offsets = np.cumsum(sizes, axis=1) - sizes
        totals = [int(t) for t in sizes.sum(axis=1)]
        table_of_layer = tuple(range(len(layer_ids)))
    else:
        flat = sizes.reshape(-1)
        offsets = (np.cumsum(flat) - flat).reshape(sizes.shape)
        totals = [int(flat.sum())]
        table_of_layer = (0,) * len(layer_ids)
    return Layout(
        family="qwen",
        layer_ids=layer_ids,
        max_ngram=max_ngram,
        heads=heads,
        primes=primes,
        offsets=offsets.reshape(primes.shape),
        multipliers=qwen_multipliers(dense, max_ngram, vocab, seed),
        vocab=vocab,
        table_rows=tuple(-(-t // divisor) * divisor for t in totals),
        table_of_layer=table_of_layer,
    )
