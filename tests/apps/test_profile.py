"""engram profile: counts, shares, repeat and hit rates on a small known text, exact against a plain
Python count of the same hashed ids; and the profile file."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from engram.apps.presets import get_preset
from engram.apps.profile import BATCHES, hit_rate, profile_tables, repeat_rate, summary, top_share, write_profile

TINY = get_preset("tiny")


def text(n: int, seed: int) -> torch.Tensor:
    """A Zipf-ish token stream: a few words very often, many rarely."""
    generator = torch.Generator().manual_seed(seed)
    words = torch.randint(0, 5000, (400,), generator=generator)
    picks = (torch.rand(n, generator=generator) ** 3 * words.numel()).long()
    return words[picks]


def test_profile_counts_and_rates_are_exact(tmp_path: Path) -> None:
    fit, held = text(9000, 1), text(3000, 2)
    row_bytes = 32 + 1  # tiny: fp8 rows of 32 plus one scale
    profiles = profile_tables(TINY, fit, held, [10 * row_bytes, 100 * row_bytes])
    fit_rows = TINY.hasher().hash(TINY.compress(fit))
    held_rows = TINY.hasher().hash(TINY.compress(held))
    for table, profile in enumerate(profiles):
        layer = TINY.layout.table_of_layer.index(table)
        counts = Counter(fit_rows[:, layer].reshape(-1).tolist())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))  # ties: the smaller row first
        assert profile.hot_counts.tolist() == [c for _, c in ranked[:100]]
        assert profile.hot_rows.tolist() == [r for r, _ in ranked[:100]]
        for size, cached in ((10, 10), (100, 100)):
            hot = set(profile.hot_rows[:cached].tolist())
            held_ids = held_rows[:, layer].reshape(-1).tolist()
            assert abs(profile.hit_rate[size * row_bytes] - sum(i in hot for i in held_ids) / len(held_ids)) < 1e-9
        heads = TINY.layout.heads
        for n in range(2, TINY.max_ngram + 1):
            order = Counter(fit_rows[:, layer, (n - 2) * heads : (n - 1) * heads].reshape(-1).tolist())
            assert profile.rows_seen[str(n)] == len(order)  # shares are of the rows the sample touched
            for label, share in (("top 1%", 0.01), ("top 10%", 0.1)):
                k = max(1, int(len(order) * share))
                want = sum(sorted(order.values(), reverse=True)[:k]) / sum(order.values())
                assert abs(profile.top_share[str(n)][label] - want) < 1e-9
        flat = fit_rows[:, layer]
        for shape, batch in BATCHES.items():
            windows = [flat[s : s + batch].reshape(-1).tolist() for s in range(0, flat.shape[0] - batch + 1, batch)]
            want = sum(1 - len(set(w)) / len(w) for w in windows) / len(windows)
            assert abs(profile.repeat_rate[shape] - want) < 1e-9
    report = summary(TINY, profiles, fit.numel(), held.numel())
    write_profile(tmp_path / "p.safetensors", TINY, profiles, report)
    with safe_open(str(tmp_path / "p.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("layers.1.engram.embed.hot_rows"), profiles[0].hot_rows)
        assert '"fit_tokens": 9000' in f.metadata()["engram_profile"]


def test_rate_helpers() -> None:
    assert top_share(torch.tensor([5, 3, 1, 1]), share=0.5) == 0.8
    assert top_share(torch.tensor([5, 3, 1, 1]), share=0.02) == 0.5  # at least the hottest row
    assert top_share(torch.tensor([1] * 200), share=0.01) == 0.01  # uniform text: 1% of rows, 1% of lookups
    assert top_share(torch.tensor([], dtype=torch.int64), share=0.5) == 0.0
    assert repeat_rate(torch.tensor([[1, 1], [2, 3], [4, 4], [4, 4]]), 2) == (0.25 + 0.75) / 2
    assert hit_rate(torch.tensor([1, 2]), torch.tensor([1, 3, 2, 2])) == 0.75


def test_profile_command(tiny_profile: tuple[dict[str, Any], Path, Path], capsys: object) -> None:
    from engram.cli import main

    report, out, plot = tiny_profile
    assert report["fit_tokens"] == 8192 and report["held_out_tokens"] == 2000
    assert [t["table"] for t in report["tables"]] == ["layers.1.engram.embed", "layers.3.engram.embed"]
    assert all(0 <= r <= 1 for t in report["tables"] for r in t["hit_rate_by_cache_bytes"].values())
    assert out.stat().st_size > 0 and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["profile", "--preset", "tiny", "--tokens", "100"]) == 2
    assert (
        capsys.readouterr().err
        == "error: --tokens must be at least 8192 (one prefill batch) and --held-out-tokens at least 256\n"
    )  # type: ignore[attr-defined]


def test_profile_text_leads_with_the_held_out_hit_rates(
    tiny_profile: tuple[dict[str, Any], Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Per table the held-out hit rates come first; concentration is over the rows the sample touched."""
    from engram.cli import main

    report = tiny_profile[0]
    assert main(["profile", "--preset", "tiny", "--tokens", "8192", "--held-out-tokens", "2000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for table in report["tables"]:
        at = lines.index(f"  {table['table']}: {table['rows']:,} rows of {table['row_bytes']} B")
        caches = len(table["hit_rate_by_cache_bytes"])
        assert all(line.startswith("    device cache of ") for line in lines[at + 1 : at + 1 + caches])
        for offset, (order, shares) in enumerate(table["top_share_by_order"].items()):
            seen = table["rows_seen_by_order"][order]
            assert 0 < seen <= table["rows"]
            assert lines[at + 2 + caches + offset] == (
                f"    {order}-grams: {seen:,} distinct rows seen; the hottest 0.1 / 1 / 5 / 10% of them take "
                + " / ".join(f"{v:.1%}" for v in shares.values())
                + " of lookups"
            )
