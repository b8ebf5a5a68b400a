"""Tiers of hot rows on real text: online admission (engram.runtime.tiers) against static profiles, on the
V4.1 layer tables (real hashing, 1% of each table's rows by default), replayed in order by the code
`engram profile --text` runs. Two kinds of text, each from two sources: the defaults (window, half-life)
were tuned on the Python standard library's code and the man pages; the figures that count are on held
back sources, which the tuning never saw: the code of the installed site-packages (torch, numpy, ...) and
the prose of /usr/share/doc (changelogs, copyright notices, READMEs) and of the installed packages'
descriptions (METADATA). Each kind's text is split by file into a fit part and a served part.

Targets, printed side by side:
- after a switch of domain (served: code, then prose; and prose, then code), the online tier warmed on
  the first kind's fit part reaches, within 100k tokens of the switch, >= 0.9x the hit rate of the
  in-domain static profile (fitted on the second kind's fit part) over a span of 4 windows (32k tokens);
- on in-domain traffic, online (warmed on the same kind's fit part) never falls more than 2 points below
  the static profile of that kind, span by span. Both policies are also given over the whole stream.
Run: python benchmarks/bench_tiers.py [--tokens N] [--fraction F] [--window N] [--json]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sysconfig
from pathlib import Path

import torch
from _timing import print_table

from engram.apps.corpus import _docstrings, documents
from engram.apps.presets import get_preset
from engram.apps.replay import Replay, replay, table_ids
from engram.ngram.vocab import deepseek_v4_tokenizer

MAX_FILE = 1 << 20
SWITCH_BUDGET = 100_000  # tokens after the switch within which online must reach 0.9x


def _held_out(path: Path) -> bool:
    return hashlib.sha256(str(path).encode()).digest()[0] < 128  # half the files serve, half fit


def held_back_texts() -> dict[str, list[tuple[Path, str]]]:
    """Code and prose from sources the defaults were not tuned on."""
    site = Path(sysconfig.get_paths()["purelib"])
    code = [(p, p.read_bytes()[:MAX_FILE].decode("utf-8", "replace")) for p in sorted(site.rglob("*.py"))]
    prose: list[tuple[Path, str]] = []
    for p in sorted(Path("/usr/share/doc").rglob("*")):
        if p.is_file() and not p.is_symlink():
            raw = p.read_bytes()[:MAX_FILE]
            try:
                raw = gzip.decompress(raw) if p.suffix == ".gz" else raw
            except (OSError, EOFError):
                continue
            prose.append((p, raw.decode("utf-8", "replace")))
    prose += [(p, p.read_text("utf-8", "replace")) for p in sorted(site.rglob("METADATA"))]
    prose += [(p, _docstrings(text)) for p, text in code[::7]]  # docstrings of other code than the stdlib's
    return {"code": code, "prose": [(p, t) for p, t in prose if t.strip()]}


def tuning_texts() -> dict[str, list[tuple[Path, str]]]:
    docs = documents()
    return {
        "code": [(p, t) for kind, p, t in docs if kind == "code"],
        "prose": [(p, t) for kind, p, t in docs if kind == "man"],
    }


def split_tokens(texts: list[tuple[Path, str]], tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fit, served) token streams of up to `tokens` each, the files split by a hash of their path."""
    tokenizer = deepseek_v4_tokenizer()
    parts: dict[bool, list[torch.Tensor]] = {True: [], False: []}
    have = {True: 0, False: 0}
    for path, text in texts:
        side = _held_out(path)
        if have[side] >= tokens:
            if min(have.values()) >= tokens:
                break
            continue
        ids = torch.tensor(tokenizer.encode(text[:MAX_FILE], add_special_tokens=False).ids, dtype=torch.int64)
        parts[side].append(ids)
        have[side] += ids.numel()
    fit, served = (
        torch.cat(parts[s])[:tokens] if parts[s] else torch.empty(0, dtype=torch.int64) for s in (False, True)
    )
    return fit, served


SPAN = 4  # windows per span of the comparisons (32k tokens at the default window)


def windows_after(result: Replay, start_window: int) -> list[float]:
    """Hit rates of spans of SPAN windows from `start_window` on (a span's hits over its lookups)."""
    windows = result.windows[start_window:]
    spans = [windows[i : i + SPAN] for i in range(0, len(windows), SPAN)]
    return [sum(w.hits for w in s) / sum(w.lookups for w in s) for s in spans if sum(w.lookups for w in s)]


def run(sources: dict[str, list[tuple[Path, str]]], label: str, args: argparse.Namespace) -> dict[str, object]:
    spec = get_preset("deepseek-v4.1-flash")
    fit, served = {}, {}
    for kind, texts in sources.items():
        f, s = split_tokens(texts, args.tokens)
        fit[kind], served[kind] = table_ids(spec, f), table_ids(spec, s)
        print(f"{label} {kind}: {f.numel():,} fit tokens, {s.numel():,} served", flush=True)
    out: dict[str, object] = {"label": label}
    rows = []
    for first, second in (("code", "prose"), ("prose", "code")):
        stream = {name: torch.cat([served[first][name], served[second][name]]) for name in served[first]}
        switch = served[first][next(iter(served[first]))].shape[0] // args.window
        online = replay(spec, stream, [args.fraction], ["online"], fit=fit[first], window_tokens=args.window)[0]
        static_new = replay(spec, stream, [args.fraction], ["static"], fit=fit[second], window_tokens=args.window)[0]
        static_old = replay(spec, stream, [args.fraction], ["static"], fit=fit[first], window_tokens=args.window)[0]
        after_online, after_static = windows_after(online, switch), windows_after(static_new, switch)
        # the first span after the switch where online reaches 0.9x the in-domain static profile's rate
        reached = next(
            (i for i, (o, s) in enumerate(zip(after_online, after_static, strict=True)) if o >= 0.9 * s), None
        )
        within = None if reached is None else (reached + 1) * SPAN * args.window
        rows.append([
            f"{first} -> {second}", f"{sum(after_static) / len(after_static):.1%}",
            f"{sum(windows_after(static_old, switch)) / len(after_static):.1%}",
            f"{sum(after_online) / len(after_online):.1%}", f"{after_online[-1]:.1%}",
            "never" if within is None else f"{within:,}", "yes" if within is not None and within <= SWITCH_BUDGET else "NO",
        ])  # fmt: skip
        out[f"{first}->{second}"] = {"static_in_domain": after_static, "online": after_online, "tokens_to_0.9x": within}
    print_table(
        ["switch", "static (new kind)", "static (old kind)", "online after switch", "online last span",
         "tokens to 0.9x", "<= 100k"], rows,
    )  # fmt: skip
    rows = []
    for kind in ("code", "prose"):
        online = replay(spec, served[kind], [args.fraction], ["online"], fit=fit[kind], window_tokens=args.window)[0]
        static = replay(spec, served[kind], [args.fraction], ["static"], fit=fit[kind], window_tokens=args.window)[0]
        gaps = [s - o for o, s in zip(windows_after(online, 0), windows_after(static, 0), strict=True)]
        rows.append([
            kind, f"{static.hit_rate:.1%}", f"{online.hit_rate:.1%}", f"{max(gaps) * 100:+.1f}",
            "yes" if max(gaps) <= 0.02 else "NO",
        ])  # fmt: skip
        out[kind] = {"static": static.hit_rate, "online": online.hit_rate, "worst_gap_points": max(gaps) * 100}
    print_table(["in domain", "static", "online", "worst span: static - online (points)", "<= 2 points"], rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=400_000, help="tokens of each kind's fit and served parts")
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--window", type=int, default=8192)
    parser.add_argument("--tuning", action="store_true", help="also run on the sources the defaults were tuned on")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    if args.tuning:
        results.append(run(tuning_texts(), "tuning (stdlib code, man pages)", args))
    results.append(run(held_back_texts(), "held back (site-packages code, /usr/share/doc and package prose)", args))
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
