"""`engram profile`: how often n-gram ids repeat on real text, and what a device cache of hot rows would
hit on held-out text (engram.apps.profile); with --text, what the tiers of hot rows would hit on the
user's own traffic, replayed in order, online and static side by side (engram.apps.replay)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from engram.apps.corpus import load_corpus
from engram.apps.plotting import check_plot_path, figure
from engram.apps.presets import PRESETS, get_preset
from engram.apps.profile import profile_tables, summary, write_profile
from engram.apps.replay import counted, hottest, replay, replay_bytes
from engram.apps.traffic import read_traffic, tokenizer_for
from engram.commands import add_command
from engram.errors import EngramError
from engram.memory.host import free_bytes_now
from engram.ngram.spec import ModelSpec
from engram.output_files import check_output_path
from engram.runtime.table import ShardFormat
from engram.runtime.tiers.budget import POLICIES, WINDOW_IDS
from engram.terminal import size_text

GIB = 1 << 30


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "profile")
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
    parser.add_argument(
        "--text",
        nargs="+",
        metavar="FILE",
        help="replay your own traffic, in order, through the tiers: plain text, or JSON Lines with a 'prompt' or 'text' field",
    )
    parser.add_argument("--fit", nargs="+", metavar="FILE", help="with --text: the text a static profile is fitted on")
    parser.add_argument(
        "--policy",
        nargs="+",
        choices=POLICIES,
        help="with --text: the admission policies to replay (default: both with --fit, else online)",
    )
    parser.add_argument(
        "--tier",
        nargs="+",
        choices=("device", "ram"),
        default=["device"],
        help="with --text: the tiers to replay: device (HBM over host tables; refreshed once a window was served) "
        "and ram (RAM over file-backed tables; admits after every lookup). Default: device",
    )
    parser.add_argument("--tokenizer", metavar="FILE", help="the model's tokenizer.json (default: the bundled one)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=20_000_000,
        help="with --text: read at most this many tokens of each of --text and --fit (default 20M)",
    )
    parser.add_argument(
        "--window-tokens",
        type=int,
        default=8192,
        help="with --text: tokens per point of the hit-rate curve (default 8192)",
    )
    parser.add_argument("--out", type=Path, help="write the hot rows and counts (safetensors) here")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the held-out hit rate against cache size")
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    spec = get_preset(args.preset)
    if args.text:
        return run_replay(args, spec)
    if args.fit or args.policy:
        raise EngramError("--fit and --policy replay your own text: give it with --text FILE")
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


def run_replay(args: argparse.Namespace, spec: ModelSpec) -> int:
    """--text: the served stream replayed through the tiers, per budget and policy."""
    if args.max_tokens < 1 or args.window_tokens < 1:
        raise EngramError("--max-tokens and --window-tokens must be at least 1")
    if not all(0 < f <= 1 for f in args.cache_fraction):
        raise EngramError("--cache-fraction values must be in (0, 1]")
    policies = args.policy or (["online", "static"] if args.fit else ["online"])
    if "static" in policies and not args.fit:
        raise EngramError("--policy static keeps the rows most frequent in the fit text: give it with --fit FILE")
    if args.plot:
        check_plot_path(args.plot)
    if args.out:
        check_output_path("--out", args.out, "hot.safetensors")
    needed, free = replay_bytes(spec, args.cache_fraction, policies, args.tier, WINDOW_IDS), free_bytes_now()
    if needed > free:  # sized before a token is read: the tiers' own state, as they would hold it serving
        raise EngramError(
            f"--text: replaying tiers of {', '.join(f'{f:g}' for f in args.cache_fraction)} of each table "
            f"({'/'.join(args.tier)}, {'/'.join(policies)}) needs {size_text(needed)} at once and "
            f"{size_text(free)} is free; give a smaller --cache-fraction, or fewer of --tier and --policy at a time"
        )
    tokenizer = tokenizer_for(spec, args.tokenizer)
    served = read_traffic(args.text, tokenizer, args.max_tokens)
    if served.tokens.numel() == 0:
        raise EngramError(f"--text: no tokens in {', '.join(args.text)}")
    fitted = read_traffic(args.fit, tokenizer, args.max_tokens) if args.fit else None
    fit = (
        counted(spec, fitted.tokens, free_bytes_now() - needed)
        if fitted is not None and fitted.tokens.numel()
        else None
    )
    if args.fit and fit is None:
        raise EngramError(f"--fit: no tokens in {', '.join(args.fit)}")
    results = replay(
        spec,
        served.tokens,
        args.cache_fraction,
        policies,
        fit=fit,
        window_tokens=args.window_tokens,
        tiers=args.tier,
    )
    row_bytes = ShardFormat(1, spec.head_dim, spec.dtype).row_bytes
    report: dict[str, Any] = {
        "preset": spec.name,
        "files": [{"path": path, "tokens": tokens} for path, tokens in served.files],
        "fit_files": [] if fitted is None else [{"path": path, "tokens": tokens} for path, tokens in fitted.files],
        "window_tokens": args.window_tokens,
        "results": [
            {
                "policy": r.policy,
                "tier": r.tier,
                "cache_fraction": r.cache_fraction,
                "rows": r.rows,
                "bytes": sum(r.rows.values()) * row_bytes,
                "hit_rate": r.hit_rate,
                "windows": [{"tokens": w.tokens, "lookups": w.lookups, "hits": w.hits} for w in r.windows],
            }
            for r in results
        ],
    }
    if args.out and fit is not None:
        largest = max(report["results"], key=lambda r: r["cache_fraction"])
        write_hot_rows(args.out, spec, fit, largest["rows"])
    if args.plot:
        draw_replay(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    tokens = sum(t for _, t in served.files)
    print(f"{spec.name}: {tokens:,} tokens of {len(served.files)} file(s) replayed in order, through each tier")
    for fraction in args.cache_fraction:
        shown = [r for r in report["results"] if r["cache_fraction"] == fraction]
        print(
            f"  tiers of {fraction:.2%} of each table's rows ({shown[0]['bytes'] / GIB:.2f} GiB of rows in all, in HBM or RAM):"
        )
        for r in shown:
            print(
                f"    {r['policy']:>6} {r['tier']:>6}: {r['hit_rate']:.1%} of lookups hit; per {args.window_tokens:,} tokens: {curve(r['windows'])}"
            )
    if args.out and fit is not None:
        print(f"profile (fitted on --fit): {args.out}")
    return 0


def curve(windows: list[dict[str, int]], points: int = 12) -> str:
    """Up to `points` evenly spaced windows' hit rates."""
    step = max(1, len(windows) // points)
    return " ".join(f"{w['hits'] / w['lookups']:.0%}" if w["lookups"] else "-" for w in windows[::step])


def write_hot_rows(path: Path, spec: ModelSpec, fit: dict[str, Any], rows: dict[str, int]) -> None:
    """The hot rows of the fit text (most frequent first) per table, as `engram profile --out` writes them."""
    from engram.apps.profile import TableProfile

    profiles = []
    for name, seen in fit.items():
        hot, counts = hottest(seen, rows[name])
        profiles.append(TableProfile(name, 0, 0, hot_rows=hot, hot_counts=counts))
    write_profile(path, spec, profiles, {"preset": spec.name, "fitted_on": "--fit"})


def draw_replay(report: dict[str, Any], path: str) -> None:
    with figure(path) as axes:
        for r in report["results"]:
            at, xs, ys = 0, [], []
            for w in r["windows"]:
                at += w["tokens"]
                if w["lookups"]:
                    xs.append(at)
                    ys.append(100 * w["hits"] / w["lookups"])
            axes.plot(xs, ys, label=f"{r['policy']} {r['tier']} tier, {r['cache_fraction']:.2%} of rows")
        axes.set_xlabel("tokens served")
        axes.set_ylabel(f"lookups that hit, % (per {report['window_tokens']:,} tokens)")
        axes.set_title(f"{report['preset']}: tiers of hot rows on your traffic")
