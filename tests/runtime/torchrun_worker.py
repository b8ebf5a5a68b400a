"""Started by torchrun (4 processes): TP 2 x DP 2 with embedding_across_dp, groups from the environment."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # torchrun runs this file as a script

from engram.config import ParallelConfig, load_config
from engram.runtime.engine import EngramTables, init_from_env
from tests.runtime.reference import expected_lookup, expected_tables
from tests.runtime.sharding_workers import batches, matches
from tests.runtime.specs import DS7


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    rank = init_from_env()
    parallel = ParallelConfig(tensor_parallel_size=2, data_parallel_size=2)
    tables = EngramTables.build(
        DS7,
        load_config({"embedding_across_dp": True, "dp_shared_memory": False}, env={}),
        parallel,
        args.checkpoint,
        progress=False,
    )
    wanted = expected_tables(args.checkpoint, DS7)
    match = all(
        matches(tables.lookup(ids), expected_lookup(wanted, DS7, ids))
        for ids in batches(DS7, tables.rank_plan.dp_rank, 2)
    )
    plan = tables.rank_plan
    (args.out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rank": rank,
                "tp_rank": plan.tp_rank,
                "dp_rank": plan.dp_rank,
                "match": match,
                "group": list(plan.embedding_group),
            }
        )
    )
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
