"""Run a function on N local processes joined by torch.distributed (gloo on 127.0.0.1, a free port),
as the demo and the multi-process tests do. Processes are spawned (never forked: torch and threads do
not survive fork), the whole run is bounded by a timeout, and every process is gone when it returns."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from engram.errors import ConfigError, EngramError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Outcome:
    """What one rank did: its return value, or its error (one line for EngramError, else a traceback)."""

    rank: int
    value: Any = None
    error: str | None = None
    exitcode: int | None = None


def _child(
    rank: int,
    world: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    results: Any,
    dist_timeout: float,
) -> None:
    os.environ.update(env)
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=dist_timeout),
        )
        results.put(Outcome(rank, value=fn(rank, world, *args)))
    except (EngramError, ConfigError) as exc:  # user mistakes: one line, no traceback
        results.put(Outcome(rank, error=str(exc)))
    except BaseException:  # report anything, so the parent never waits on a silent child
        results.put(Outcome(rank, error=traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local(
    world: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    dist_timeout: float = 120.0,
    on_start: Callable[[Sequence[mp.process.BaseProcess]], None] | None = None,
) -> list[Outcome]:
    """fn(rank, world, *args) on `world` processes; an Outcome per rank, in rank order. A rank that dies
    without reporting (killed, crashed) has error set and its exit code. After `timeout` seconds the
    remaining processes are killed and reported as timed out."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_child, args=(r, world, port, fn, args, dict(env or {}), results, dist_timeout), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    if on_start is not None:
        on_start(procs)
    outcomes: dict[int, Outcome] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(outcomes) < world and time.monotonic() < deadline:
            try:
                outcome = results.get(timeout=0.2)
                outcomes[outcome.rank] = outcome
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        results.close()
    for rank, p in enumerate(procs):
        if rank not in outcomes:
            reason = (
                "timed out"
                if p.exitcode in (None, -9) and time.monotonic() >= deadline
                else f"died with exit code {p.exitcode}"
            )
            outcomes[rank] = Outcome(rank, error=f"rank {rank} {reason} before reporting", exitcode=p.exitcode)
        else:
            outcomes[rank] = Outcome(rank, outcomes[rank].value, outcomes[rank].error, p.exitcode)
    return [outcomes[r] for r in range(world)]


def values(outcomes: list[Outcome]) -> list[Any]:
    """The ranks' return values, or one EngramError that lists every rank's failure."""
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise EngramError("; ".join(f"rank {o.rank}: {o.error}" for o in failed))
    return [o.value for o in outcomes]
