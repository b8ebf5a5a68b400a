"""CPU lookup, one run: rows/s and GB/s for 256- and 512-byte rows drawn uniformly from a table of at
least 2 GB, EngramEmbedding (one rank, no collectives) against torch.index_select on the same table (the
fastest stock CPU gather; target: at least 0.9x), and a large sequential copy as the bandwidth ceiling;
on ordinary pages and on transparent huge pages. Run: python benchmarks/bench_lookup.py [--json]
"""

from __future__ import annotations

import argparse
import json

import torch
from _timing import median_seconds, print_table

from engram.runtime.embedding import EngramEmbedding
from engram.runtime.plan import TableShardPlan
from engram.runtime.storage import ShardFormat, allocate

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
    engram_s = median_seconds(lambda: module(ids), number=3)
    select_s = median_seconds(lambda: shard.weight.index_select(0, flat), number=3)
    block = shard.weight[: min(rows, (1 << 30) // row_bytes)]
    copy_s = median_seconds(lambda: block.clone(), number=1)
    moved = flat.numel() * row_bytes
    result = {
        "row_bytes": row_bytes,
        "pages": "huge" if placement == "hugepages" else "4 KiB",
        "note": shard.note,
        "engram_rows_per_s": flat.numel() / engram_s,
        "engram_gbps": moved / engram_s / 1e9,
        "index_select_gbps": moved / select_s / 1e9,
        "sequential_copy_gbps": block.numel() * 2 / copy_s / 1e9,
        "ratio": select_s / engram_s,
    }
    shard.release()  # unmapped when `module` and `block` go, at return
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--table-gb", type=float, default=2.0)
    parser.add_argument("--lookups", type=int, default=1 << 18)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [
        measure(row_bytes, int(args.table_gb * 2**30), args.lookups, placement)
        for placement in ("host", "hugepages")
        for row_bytes in (256, 512)
    ]
    if args.json:
        keys = ("row_bytes", "pages", "engram_gbps", "index_select_gbps", "sequential_copy_gbps", "ratio")
        print(json.dumps({"rows": [{k: r[k] for k in keys} for r in results]}))
        return
    print(
        f"table {args.table_gb:g} GiB of bf16 rows, {args.lookups:,} uniform lookups a call, torch threads {torch.get_num_threads()}"
    )
    rows = [
        [
            str(r["row_bytes"]),
            str(r["pages"]),
            f"{r['engram_rows_per_s'] / 1e6:.1f}",
            f"{r['engram_gbps']:.2f}",
            f"{r['index_select_gbps']:.2f}",
            f"{r['sequential_copy_gbps']:.2f}",
            f"{r['ratio']:.2f}x",
        ]
        for r in results
    ]
    print_table(
        [
            "row bytes",
            "pages",
            "engram M rows/s",
            "engram GB/s",
            "index_select GB/s",
            "seq copy GB/s",
            "engram / index_select",
        ],
        rows,
    )
    print("target: engram >= 0.9x index_select")
    for r in results:
        if r["pages"] == "huge":
            print(f"huge pages ({r['row_bytes']} B rows): {r['note']}")


if __name__ == "__main__":
    main()
