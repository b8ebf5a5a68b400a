"""One independent engine process for the node-sharing tests (`run`, started from a fork server that
has imported torch once): its own torch.distributed world of one, EngramTables.build with node_sharing,
then it reports and waits to be told to measure and to exit.

It logs to REPORT.log, writes REPORT.ready (JSON: pid, per table origin, loaded_by, digest) once built, REPORT.pss (JSON: its
tables' PSS) once REPORT.go exists, and exits once REPORT.exit exists (each wait at most 120 s). With
`pause_at`, it stops at that stage of loading or serving a copy (engram.runtime.placement.node_sharing's
stages, or "filling": half-way into the copy's bytes), writes REPORT.stage and sleeps until killed.
`rows` N builds rows [0, N) of each table only (another shard of the same checkpoint). `sandboxed`: it can
open no netlink socket (tests.seccomp), so the kernel cannot name socket owners for it. `node_dir`: the
engines meet in that rendezvous directory."""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engram.config import ParallelConfig, load_config
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.engine import EngramTables
from engram.runtime.placement import node_copy
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables, tables_pss
from tests.runtime.specs import SMALL
from tests.runtime.workers import shard_digest
from tests.seccomp import deny_netlink

WAIT_S = 120.0


def wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} never appeared")
        time.sleep(0.01)


def pause_at(stage: str, report: Path) -> None:
    """Make the copy's loading or serving stop at `stage`, telling the test where it stopped."""

    def stop() -> None:
        report.with_suffix(".stage").write_text(json.dumps({"pid": os.getpid(), "stage": stage}))
        time.sleep(600)

    theirs = node_copy.obtain

    def obtain(key: Any, size: int, fill: Any, **options: Any) -> Any:
        def filling(mapping: Any) -> None:
            mapping.view(0, (size // 2,), torch.uint8).fill_(0xAB)  # a partial table in the memfd
            stop()

        def told(name: str) -> None:
            if name == stage:
                stop()

        return theirs(key, size, filling if stage == "filling" else fill, **{**options, "stage": told})

    node_copy.obtain = obtain  # type: ignore[assignment]


def run(
    checkpoint: str,
    report: Path,
    mode: str = "node",
    stage: str | None = None,
    rows: int | None = None,
    sandboxed: bool = False,
    node_dir: str | None = None,
) -> None:
    """The engine (module docstring); a failure's traceback goes to REPORT.error."""
    try:
        engine(checkpoint, report, mode, stage, rows, sandboxed, node_dir)
    except BaseException:
        report.with_suffix(".error").write_text(traceback.format_exc())
        raise


def engine(
    checkpoint: str, report: Path, mode: str, stage: str | None, rows: int | None, sandboxed: bool, node_dir: str | None
) -> None:
    os.environ["ENGRAM_DIST_TIMEOUT_S"] = "60"
    handler = logging.FileHandler(report.with_suffix(".log"))
    handler.setFormatter(logging.Formatter("%(message)s"))
    logging.getLogger("engram").addHandler(handler)
    logging.getLogger("engram").setLevel(logging.INFO)
    if stage:
        pause_at(stage, report)
    started = time.monotonic()
    if rows is None:
        store = report.with_suffix(".store")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        if sandboxed:  # after gloo, which lists the network's interfaces over netlink
            deny_netlink()
        settings = {"cpu_offload": True, "node_sharing": mode, "dp_shared_memory": False, "node_dir": node_dir}
        config = load_config(settings, env={})
        tables = EngramTables.build(SMALL, config, ParallelConfig(), checkpoint, progress=False)
        shards = tables.shards
        origins = {s.name: [s.origin, s.loaded_by] for s in tables.stats()}
    else:
        if sandboxed:
            deny_netlink()
        plans = [replace(p, kind="row", row_start=0, row_stop=rows) for p in table_shards(SMALL, 0, 1)]
        shards = open_tables(SMALL, Checkpoint(checkpoint), "node", plans=plans, progress=False, node_dir=node_dir)
        origins = {s.name: ["attached" if s.attached else "loaded", s.loaded_by] for s in shards}
    ready = time.monotonic() - started
    digests = {s.name: shard_digest(s) for s in shards}
    told = {"pid": os.getpid(), "origins": origins, "digests": digests, "ready_s": ready}
    report.with_suffix(".ready").write_text(json.dumps(told))
    wait_for(report.with_suffix(".go"))
    report.with_suffix(".pss").write_text(json.dumps({"pss": tables_pss(shards)}))
    wait_for(report.with_suffix(".exit"))
