"""A plain scalar n-gram hasher written straight from the n-gram hashing contract (Engram's and vLLM 0.33's), with Python integers and a
loop per token: the reference the vectorised hashers are tested against."""

from __future__ import annotations

from engram.ngram.layout import Layout

MASK = (1 << 64) - 1


def reference_rows(
    layout: Layout, ids: list[int], dead: list[bool], fill: int, eos: int | None = None
) -> list[list[list[int]]]:
    """[T][layer][(N-1)*K] global row ids for one whole request."""
    out = []
    for t in range(len(ids)):
        words = []
        blocked = False
        for k in range(layout.max_ngram):
            at = t - k
            # Latching: once a lookback is blocked, every longer one is too. Blocked: before the request,
            # a dead position, or (Qwen) an EOS behind the token, which ends an earlier segment.
            if at < 0 or dead[at] or (eos is not None and k >= 1 and ids[at] == eos):
                blocked = True
            words.append(fill if blocked else ids[at])
        per_layer = []
        for li in range(len(layout.layer_ids)):
            mult = [int(m) for m in layout.multipliers[li]]
            mix = (words[0] * mult[0]) & MASK
            row = []
            for n in range(2, layout.max_ngram + 1):
                mix ^= (words[n - 1] * mult[n - 1]) & MASK
                for h in range(layout.heads):
                    prime = int(layout.primes[li, n - 2, h])
                    row.append(mix % prime + int(layout.offsets[li, n - 2, h]))
            per_layer.append(row)
        out.append(per_layer)
    return out
