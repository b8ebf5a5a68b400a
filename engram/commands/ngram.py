"""`engram ngram` (row ids for a text or ids) and `engram layout` (a preset's table layout)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from engram.apps.presets import PRESETS, get_preset
from engram.commands import add_command
from engram.errors import EngramError
from engram.ngram.vocab import deepseek_v4_tokenizer


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "ngram")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="text to tokenize with the preset's tokenizer")
    source.add_argument("--ids", type=_int_list, help="comma-separated token ids (raw unless --compressed)")
    parser.add_argument("--compressed", action="store_true", help="--ids are already compressed ids")
    parser.add_argument(
        "--dead", type=_int_list, default=[], help="comma-separated dead positions (image placeholders, masked)"
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run_ngram)

    layout = add_command(subparsers, "layout")
    layout.add_argument("--preset", required=True, choices=sorted(PRESETS))
    layout.add_argument("--json", action="store_true")
    layout.set_defaults(run=run_layout)


def _int_list(text: str) -> list[int]:
    """Comma-separated integers, each within int64 (what a token id or position can be)."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            value = int(part) if len(part) <= 40 else None
        except ValueError:
            value = None
        if value is None:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {part[:60]!r}")
        if not -(1 << 63) <= value < 1 << 63:
            raise argparse.ArgumentTypeError(f"{value} is outside the 64-bit integers an id can be")
        values.append(value)
    return values


def run_ngram(args: argparse.Namespace) -> int:
    spec = get_preset(args.preset)
    raw: list[int] | None
    if args.text is not None:
        if spec.tokenizer != "deepseek-v4":
            raise EngramError(f"preset {spec.name} has no bundled tokenizer; pass --ids")
        try:
            args.text.encode("utf-8")  # bytes the locale could not decode arrive as lone surrogates
        except UnicodeEncodeError:
            raise EngramError("--text is not valid UTF-8; pass UTF-8 text, or token ids with --ids") from None
        raw = deepseek_v4_tokenizer().encode(args.text, add_special_tokens=False).ids
    else:
        raw = None if args.compressed else args.ids
    compressed = (
        torch.tensor(args.ids, dtype=torch.int64)
        if raw is None
        else spec.compress(torch.tensor(raw, dtype=torch.int64))
    )
    dead = torch.zeros(compressed.numel(), dtype=torch.bool)
    for position in args.dead:
        if not 0 <= position < compressed.numel():
            raise EngramError(f"--dead position {position} is outside the {compressed.numel()} tokens")
        dead[position] = True
    rows = spec.hasher().hash(compressed, dead)
    layers = {str(layer_id): rows[:, i, :].tolist() for i, layer_id in enumerate(spec.layout.layer_ids)}
    if args.json:
        print(
            json.dumps({"preset": spec.name, "raw_ids": raw, "compressed_ids": compressed.tolist(), "layers": layers})
        )
        return 0
    print(f"preset {spec.name}: {compressed.numel()} tokens, {spec.layout.columns} row ids per layer")
    for t in range(compressed.numel()):
        head = f"{t:>4}  raw {raw[t] if raw is not None else '-':>7}  compressed {int(compressed[t]):>6}{'  dead' if dead[t] else ''}"
        print(head)
        for layer_id, ids in layers.items():
            print(f"        layer {layer_id:>3}: {' '.join(str(i) for i in ids[t])}")
    return 0


def layout_summary(name: str) -> dict[str, Any]:
    spec = get_preset(name)
    layout = spec.layout
    layers = []
    for i, layer_id in enumerate(layout.layer_ids):
        primes = layout.primes[i].reshape(-1)
        offsets = layout.offsets[i].reshape(-1)
        rows = layout.layer_rows[i]
        layers.append(
            {
                "layer_id": layer_id,
                "rows": rows,
                "bytes": rows * spec.row_bytes,
                "primes": {"first": int(primes[0]), "last": int(primes[-1]), "count": int(primes.size)},
                "offsets": {"first": int(offsets[0]), "last": int(offsets[-1])},
            }
        )
    tables = [
        {"name": n, "rows": r, "bytes": r * spec.row_bytes}
        for n, r in zip(spec.table_names(), layout.table_rows, strict=True)
    ]
    return {
        "preset": spec.name,
        "family": spec.family,
        "dtype": spec.dtype,
        "row_bytes": spec.row_bytes,
        "columns": layout.columns,
        "layers": layers,
        "rows": [layer["rows"] for layer in layers],
        "tables": tables,
        "bytes": spec.table_bytes,
    }


def run_layout(args: argparse.Namespace) -> int:
    summary = layout_summary(args.preset)
    if args.json:
        print(json.dumps(summary))
        return 0
    scales = " (scales included)" if summary["dtype"] == "fp8" else ""
    print(
        f"preset {summary['preset']} ({summary['family']}): {summary['dtype']} rows of {summary['row_bytes']} bytes{scales}, {summary['columns']} heads per layer"
    )
    for layer in summary["layers"]:
        p, o = layer["primes"], layer["offsets"]
        print(
            f"  layer {layer['layer_id']:>3}: {layer['rows']:>13,} rows  {layer['bytes']:>17,} bytes  primes {p['first']}..{p['last']} ({p['count']})  offsets {o['first']}..{o['last']}"
        )
    for table in summary["tables"]:
        print(f"  table {table['name']}: {table['rows']:,} rows, {table['bytes']:,} bytes")
    print(f"  total: {summary['bytes']:,} bytes ({summary['bytes'] / 2**30:.1f} GiB)")
    return 0
