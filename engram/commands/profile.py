"""`engram profile`: how often n-gram ids repeat on real text, and what a device cache of hot rows would
hit on held-out text (engram.apps.profile)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engram.apps.corpus import load_corpus
from engram.apps.output_files import check_output_path
from engram.apps.plotting import check_plot_path, figure
from engram.apps.presets import PRESETS, get_preset
from engram.apps.profile import profile_tables, summary, write_profile
from engram.errors import EngramError

GIB = 1 << 30


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "profile", help="Zipf profile of a preset's n-gram ids on real text, and cache hit rates"
    )
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--tokens", type=int, default=1_000_000, help="fit tokens from the corpus (default 1M)")
    parser.add_argument("--held-out-tokens", type=int, default=250_000, help="held-out tokens (default 250k)")
    parser.add_argument(
        "--cache-fraction",
        type=float,
        nargs="+",
        default=[0.001, 0.01, 0.05],
        help="device cache sizes as fractions of each table (default 0.1%% 1%% 5%%)",
    )
    parser.add_argument("--out", type=Path, help="write the hot rows and counts (safetensors) here")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the held-out hit rate against cache size")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = get_preset(args.preset)
    if args.tokens < 8192 or args.held_out_tokens < 256:
        raise EngramError("--tokens must be at least 8192 (one prefill batch) and --held-out-tokens at least 256")
    if not all(0 < f <= 1 for f in args.cache_fraction):
        raise EngramError("--cache-fraction values must be in (0, 1]")
    if args.plot:
        check_plot_path(args.plot)
    if args.out:
        check_output_path("--out", args.out, "hot.safetensors")
    corpus = load_corpus()
    fit, held = corpus.fit[: args.tokens], corpus.held_out[: args.held_out_tokens]
    table_bytes = spec.table_bytes // len(spec.table_names())
    sizes = sorted({max(1, int(f * table_bytes)) for f in args.cache_fraction})
    profiles = profile_tables(spec, fit, held, sizes)
    report = summary(spec, profiles, fit.numel(), held.numel())
    report["corpus"] = {"tokens": corpus.tokens.numel(), "sources": corpus.sources}
    if args.out:
        write_profile(args.out, spec, profiles, report)
    if args.plot:
        draw(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{spec.name}: {report['fit_tokens']:,} fit and {report['held_out_tokens']:,} held-out tokens of real text ({corpus.tokens.numel():,} in the corpus)"
    )
    for table in report["tables"]:
        print(f"  {table['table']}: {table['rows']:,} rows of {table['row_bytes']} B")
        for size, rate in table["hit_rate_by_cache_bytes"].items():
            share = table["cache_share_of_table"][size]
            print(
                f"    device cache of {int(size) / GIB:.2f} GiB ({share:.1%} of the table): {rate:.1%} of held-out lookups hit"
            )
        print("    repeats within a batch: " + ", ".join(f"{k} {v:.1%}" for k, v in table["repeat_rate"].items()))
        for order, shares in table["top_share_by_order"].items():
            tops = " / ".join(k.removeprefix("top ").removesuffix("%") for k in shares)
            print(
                f"    {order}-grams: {table['rows_seen_by_order'][order]:,} distinct rows seen; the hottest {tops}% "
                f"of them take {' / '.join(f'{v:.1%}' for v in shares.values())} of lookups"
            )
    if args.out:
        print(f"profile: {args.out}")
    return 0


def draw(report: dict[str, Any], path: str) -> None:
    with figure(path) as axes:
        for table in report["tables"]:
            shares = [100 * table["cache_share_of_table"][k] for k in table["hit_rate_by_cache_bytes"]]
            rates = [100 * v for v in table["hit_rate_by_cache_bytes"].values()]
            axes.plot(shares, rates, marker="o", label=table["table"])
        axes.set_xscale("log")
        axes.set_xlabel("device cache, % of the table")
        axes.set_ylabel("held-out lookups that hit, %")
        axes.set_title(f"{report['preset']}: hot rows chosen on {report['fit_tokens']:,} tokens")
