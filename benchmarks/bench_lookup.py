"""CPU lookup, one run: rows/s and GB/s for 256- and 512-byte rows drawn uniformly from a table of at
least 2 GB, EngramEmbedding (one rank, no collectives) against torch.index_select on the same table (the
fastest stock CPU gather; target: at least 0.9x), and a large sequential copy into a kept buffer as the
bandwidth ceiling; on ordinary pages and on transparent huge pages. Each gather returns a fresh output
each call, as it does in use (engram asks for huge pages for large outputs, which saves page faults), and
writes into a buffer kept across calls. Each pair (fresh, kept) is timed in turn, round after round
(interleaved medians), so the ratios hold from run to run on a shared machine where separate medians
drifted 2-3x.

Then the sorted, deduplicated gather against the plain one, both into kept buffers, from one fp8 table of
V4.1 rows (256 B + 8 B of scales) of --sorted-table-gb (default 4 GiB), for uniform ids and for the n-gram
ids of real text (engram.apps.corpus: the Python standard library's code and docstrings and English man pages,
tokenized with the DeepSeek V4 tokenizer), at a decode shape (256 tokens x 24 heads) and a prefill shape
(8,192 tokens x 24 heads).
Run: python benchmarks/bench_lookup.py [--json] [--skip-plain]
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
from _timing import interleaved_medians, median_seconds, print_table

from engram.apps.corpus import load_corpus, text_rows
from engram.apps.presets import scaled_preset
from engram.ops import gather_into
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.placement.storage import allocate
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import ShardFormat

COLUMNS = 16


def measure(row_bytes: int, table_bytes: int, lookups: int, placement: str) -> dict[str, float | int | str]:
    dim = row_bytes // 2  # bf16 rows
    rows = table_bytes // row_bytes
    shard = allocate("bench", ShardFormat(rows, dim, "bf16"), placement)  # type: ignore[arg-type]
    for start in range(0, rows, 1 << 20):  # real values, every page touched
        shard.weight[start : start + (1 << 20)].normal_()
    module = EngramEmbedding(shard, TableShardPlan("bench", rows, "row", 0, rows, 0, COLUMNS), columns=COLUMNS)
    ids = torch.randint(0, rows, (lookups // COLUMNS, COLUMNS), generator=torch.Generator().manual_seed(row_bytes))
    flat = ids.reshape(-1)
    assert torch.equal(module(ids).view(-1, dim), shard.weight.index_select(0, flat))
    buffer = module(ids)  # faulted in once
    kept = shard.weight.index_select(0, flat)  # faulted in once
    # fresh outputs against fresh, kept against kept: a fresh index_select's page faults would slow
    # whatever ran after it in the same round
    engram_s, select_s = interleaved_medians([lambda: module(ids), lambda: shard.weight.index_select(0, flat)])
    engram_kept_s, kept_s = interleaved_medians(
        [lambda: module(ids, out=buffer), lambda: torch.index_select(shard.weight, 0, flat, out=kept)]
    )
    block = shard.weight[: min(rows, (1 << 30) // row_bytes)]
    target = torch.empty_like(block)
    target.zero_()  # faulted in once: the ceiling is the copy itself, not page faults
    copy_s = median_seconds(lambda: target.copy_(block), number=1)
    moved = flat.numel() * row_bytes
    result = {
        "row_bytes": row_bytes,
        "pages": "huge" if placement == "hugepages" else "4 KiB",
        "note": shard.note,
        "engram_rows_per_s": flat.numel() / engram_s,
        "engram_gbps": moved / engram_s / 1e9,
        "engram_kept_buffer_gbps": moved / engram_kept_s / 1e9,
        "index_select_gbps": moved / select_s / 1e9,
        "index_select_kept_buffer_gbps": moved / kept_s / 1e9,
        "sequential_copy_gbps": block.numel() * 2 / copy_s / 1e9,
        "ratio": select_s / engram_s,
        "ratio_kept_buffers": kept_s / engram_kept_s,
    }
    shard.release()  # unmapped when `module`, `block` and `kept` go, at return
    return result


SHAPES = {"decode": 256, "prefill": 8192}


def measure_sorted(table_gib: float) -> list[dict[str, float | int | str]]:
    """Plain against sorted gathers of layer 0's table of a V4.1-shaped model scaled to `table_gib`."""
    spec = scaled_preset("deepseek-v4.1-flash", int(2 * table_gib * 2**30))  # two tables: layer 0's is half
    rows = spec.layout.table_rows[0]
    shard = allocate("bench", ShardFormat(rows, spec.head_dim, "fp8"), "host")
    generator = torch.Generator().manual_seed(0)
    raw = shard.weight.view(torch.uint8)
    for start in range(0, rows, 1 << 20):  # every page touched; values that are not NaN
        raw[start : start + (1 << 20)].random_(0, 120, generator=generator)
    assert shard.scale is not None
    shard.scale.view(torch.uint8).fill_(127)
    corpus = load_corpus().held_out
    results = []
    for shape, tokens in SHAPES.items():
        text = text_rows(spec, corpus, tokens, 4)
        uniform = torch.randint(0, rows, text[0][:, 0].shape, generator=generator)
        for source, ids in (("uniform", uniform), ("real text", text[1][:, 0])):
            out = torch.empty((*ids.shape, spec.head_dim), dtype=torch.bfloat16)
            sorted_out = torch.empty_like(out)
            gather_into(shard.weight, shard.scale, ids, 0, rows, out)
            gather_into(shard.weight, shard.scale, ids, 0, rows, sorted_out, True)
            assert torch.equal(out.view(torch.int16), sorted_out.view(torch.int16))
            number = 20 if shape == "decode" else 2
            plain = functools.partial(gather_into, shard.weight, shard.scale, ids, 0, rows, out)
            plain_s = median_seconds(plain, number=number)
            sorted_rows = functools.partial(gather_into, shard.weight, shard.scale, ids, 0, rows, sorted_out, True)
            sorted_s = median_seconds(sorted_rows, number=number)
            moved = ids.numel() * shard.format.row_bytes
            results.append(
                {
                    "shape": shape,
                    "ids": source,
                    "lookups": ids.numel(),
                    "distinct_share": torch.unique(ids).numel() / ids.numel(),
                    "plain_gbps": moved / plain_s / 1e9,
                    "sorted_gbps": moved / sorted_s / 1e9,
                    "ratio": plain_s / sorted_s,
                }
            )
    shard.release()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table-gb", type=float, default=2.0)
    parser.add_argument("--lookups", type=int, default=1 << 18)
    parser.add_argument("--sorted-table-gb", type=float, default=4.0)
    parser.add_argument("--skip-plain", action="store_true", help="only the sorted-against-plain comparison")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [
        measure(row_bytes, int(args.table_gb * 2**30), args.lookups, placement)
        for placement in ("host", "hugepages")
        for row_bytes in (256, 512)
        if not args.skip_plain
    ]
    sorted_results = measure_sorted(args.sorted_table_gb)
    gbps = (
        "engram_gbps",
        "index_select_gbps",
        "engram_kept_buffer_gbps",
        "index_select_kept_buffer_gbps",
        "sequential_copy_gbps",
    )
    if args.json:
        keys = ("row_bytes", "pages", *gbps, "ratio", "ratio_kept_buffers")
        print(json.dumps({"rows": [{k: r[k] for k in keys} for r in results], "sorted": sorted_results}))
        return
    print_sorted(sorted_results, args.sorted_table_gb)
    if args.skip_plain:
        return
    print(
        f"table {args.table_gb:g} GiB of bf16 rows, {args.lookups:,} uniform lookups a call, torch threads {torch.get_num_threads()}"
    )
    print(
        "GB/s of rows gathered; 'fresh': a new output each call (as a module returns); 'kept': into a buffer kept across calls"
    )
    headers = [
        "row bytes",
        "pages",
        "engram fresh",
        "index_select fresh",
        "engram kept",
        "index_select kept",
        "seq copy",
        "ratio fresh",
        "ratio kept",
    ]
    rows = [
        [str(r["row_bytes"]), str(r["pages"])]
        + [f"{r[k]:.2f}" for k in gbps]
        + [f"{r['ratio']:.2f}x", f"{r['ratio_kept_buffers']:.2f}x"]
        for r in results
    ]
    print_table(headers, rows)
    print("target: engram >= 0.9x index_select")
    for r in results:
        if r["pages"] == "huge":
            print(f"huge pages ({r['row_bytes']} B rows): {r['note']}")


def print_sorted(results: list[dict[str, float | int | str]], table_gib: float) -> None:
    print(
        f"sorted, deduplicated gather against the plain one: fp8 V4.1 rows (264 B), one {table_gib:g} GiB table, kept buffers"
    )
    headers = ["shape", "ids", "lookups", "distinct", "plain GB/s", "sorted GB/s", "sorted vs plain"]
    rows = [
        [
            str(r["shape"]),
            str(r["ids"]),
            f"{r['lookups']:,}",
            f"{float(r['distinct_share']):.0%}",
            f"{r['plain_gbps']:.2f}",
            f"{r['sorted_gbps']:.2f}",
            f"{r['ratio']:.2f}x",
        ]
        for r in results
    ]
    print_table(headers, rows)
    print()


if __name__ == "__main__":
    main()
