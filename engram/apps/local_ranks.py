"""Run a function on N local processes joined by torch.distributed (gloo on 127.0.0.1, a free port),
as the demo and the multi-process tests do. Processes fork from multiprocessing's fork server, a
single-threaded process that imported torch and the engine once (forking this process could copy
threads and locks that torch holds; spawning pays the import again for every rank), each with this
process's environment, working directory and sys.path at the call. The whole run is bounded by a
timeout, and every rank is gone when it returns.

Results come back over one pipe per rank, never a multiprocessing.Queue: a queue's named semaphores
outlive a killed process group in /dev/shm, while the kernel closes a dead process's pipes. The
rendezvous obeys ENGRAM_DIST_TIMEOUT_S like every other wait. A rank that dies without reporting ends the
run within a second: the launcher sees its pipe close and stops the others, which would wait for it until
their timeouts (SIGTERM raises Stopped in a rank, so its own clean-up runs; SIGKILL after STOP_GRACE_S),
and says which rank died. A rank whose caller dies (even by kill -9) stops the same way within a second
(_exit_with_caller), and the fork server dies with the caller (fork_server)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import select
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

from engram.apps.fork_server import CALLER_ENV
from engram.errors import ConfigError, EngramError
from engram.runtime.dist import parse_timeout, timeout_s
from engram.runtime.placement.shm import reclaim_stale

# Imported once by the fork server: first what makes it die with its caller, then torch, torch.distributed
# and the runtime.
PRELOAD = ["engram.apps.fork_server", "engram.runtime.engine"]


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


STOPPED = "stopped"  # a rank's report when it was told to stop
CALLER_POLL_MS = 500
ORPHANED = 70  # a rank's exit status when its caller died: nobody is left to read its result
STOP_GRACE_S = 0.5  # a rank told to stop has this long for its own clean-up (a named table unlinked)


class Stopped(BaseException):
    """Raised in a rank's main thread when it is told to stop (SIGTERM): another rank, or its caller, is
    gone. A BaseException: the rank's own `except Exception` does not hold it, its `finally` blocks run."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def _exit_with_caller(results: Connection, done: threading.Event) -> None:
    """End this rank when the caller is gone: told to stop, then ended STOP_GRACE_S later whatever it is
    doing. The caller holds the only read end of the rank's result pipe, so its death, however it died,
    shows on the write end as POLLERR; no signal and no parent pid to trust (the rank's parent is the fork
    server)."""
    poller = select.poll()
    poller.register(results.fileno(), 0)  # POLLERR and POLLHUP are reported whatever is asked
    while not done.is_set():
        events = poller.poll(CALLER_POLL_MS)
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in events) and not done.is_set():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(STOP_GRACE_S)
            os._exit(ORPHANED)


def _child(
    rank: int,
    world: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    env: dict[str, str],
    results: Connection,
    dist_timeout: float,
) -> None:
    os.environ.clear()  # the caller's environment as it is now (the fork server's is from its start), then env
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

    signal.signal(signal.SIGTERM, _stop)
    done = threading.Event()
    threading.Thread(target=_exit_with_caller, args=(results, done), name="engram-caller-watch", daemon=True).start()
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=dist_timeout),
        )
        outcome = Outcome(rank, value=fn(rank, world, *args))
    except (EngramError, ConfigError) as exc:  # user mistakes: one line, no traceback
        outcome = Outcome(rank, error=str(exc))
    except dist.DistError as exc:  # a peer gone before or during the rendezvous: one line too
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        outcome = Outcome(rank, error=f"rank {rank} could not reach its peers within {dist_timeout:g} s: {first[:300]}")
    except Stopped:
        outcome = Outcome(rank, error=STOPPED)
    except BaseException:  # report anything, so the parent never waits on a silent child
        outcome = Outcome(rank, error=traceback.format_exc())
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the report goes whole: a stop now waits for it
    done.set()  # the caller closes its end once it has the outcome: that is no death to exit for
    try:
        results.send(outcome)
    finally:
        results.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def run_local(
    world: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[Sequence[mp.process.BaseProcess]], None] | None = None,
) -> list[Outcome]:
    """fn(rank, world, *args) on `world` processes; an Outcome per rank, in rank order. A rank that dies
    without reporting (killed, crashed) has error set and its exit code. After `timeout` seconds the
    remaining processes are killed and reported as timed out. Waits between ranks are bounded by
    ENGRAM_DIST_TIMEOUT_S (from `env` when it sets it, else this process's environment)."""
    env = dict(env or {})
    dist_timeout = parse_timeout(env["ENGRAM_DIST_TIMEOUT_S"]) if "ENGRAM_DIST_TIMEOUT_S" in env else timeout_s()
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    os.environ[CALLER_ENV] = str(os.getpid())  # for a fork server started now (fork_server)
    env = {**os.environ, **env}
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world)]
    procs = [
        ctx.Process(target=_child, args=(r, world, port, fn, args, env, pipes[r][1], dist_timeout), daemon=True)
        for r in range(world)
    ]
    for p, (_, send) in zip(procs, pipes, strict=True):
        p.start()
        send.close()  # the child holds its own end: EOF here once it exits
    if on_start is not None:
        on_start(procs)
    outcomes: dict[int, Outcome] = {}
    died: list[int] = []  # ranks seen to end without reporting, in the order seen
    open_ends: list[Connection] = [receive for receive, _ in pipes]
    rank_of = {end: rank for rank, end in enumerate(open_ends)}
    deadline = time.monotonic() + timeout
    try:
        while open_ends and time.monotonic() < deadline:
            for ready in wait(open_ends, timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
                end = cast(Connection, ready)
                open_ends.remove(end)
                try:
                    outcome: Outcome = end.recv()
                    outcomes[outcome.rank] = outcome
                except (EOFError, OSError):  # ended without reporting
                    if not died:  # the others can only wait for it now: they are told to stop
                        deadline = min(deadline, time.monotonic() + STOP_GRACE_S)
                        for rank, p in enumerate(procs):
                            if rank != rank_of[end] and rank not in outcomes and p.is_alive():
                                p.terminate()
                    died.append(rank_of[end])
                end.close()
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))  # reported: a moment to exit
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        for end in open_ends:
            end.close()
        if any(p.exitcode != 0 for p in procs):
            _reclaim_shared_tables(env)
    first = died[0] if died else None
    cause = "" if first is None else f"rank {first} died with exit code {procs[first].exitcode} before reporting"
    for rank, p in enumerate(procs):
        if rank in outcomes and outcomes[rank].error != STOPPED:
            outcomes[rank] = Outcome(rank, outcomes[rank].value, outcomes[rank].error, p.exitcode)
            continue
        if rank == first:
            reason = cause
        elif first is not None:
            reason = f"rank {rank} was stopped: {cause}"
        else:
            reason = f"rank {rank} timed out before reporting"
        outcomes[rank] = Outcome(rank, error=reason, exitcode=p.exitcode)
    return [outcomes[r] for r in range(world)]


def _reclaim_shared_tables(env: Mapping[str, str]) -> None:
    """Named shared tables (ENGRAM_SHM_DIR) that ranks killed between a table's creation and its hand-over
    left: their owners are gone now, so they are removed here rather than at the next start."""
    directory = env.get("ENGRAM_SHM_DIR")
    if directory:
        with contextlib.suppress(EngramError, OSError):
            reclaim_stale(Path(directory))


def values(outcomes: list[Outcome]) -> list[Any]:
    """The ranks' return values, or one EngramError that lists every rank's failure."""
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise EngramError("; ".join(f"rank {o.rank}: {o.error}" for o in failed))
    return [o.value for o in outcomes]
