"""Run a function on N local processes joined by torch.distributed (gloo on 127.0.0.1, a free port),
as the demo and the multi-process tests do. Processes fork from multiprocessing's fork server, a
single-threaded process that imported torch and the engine once (forking this process could copy
threads and locks that torch holds; spawning pays the import again for every rank), each with this
process's environment, working directory and sys.path at the call. The whole run is bounded by a
timeout, and every rank is gone when it returns.

Results come back over one pipe per rank, never a multiprocessing.Queue: a queue's named semaphores
outlive a killed process group in /dev/shm, while the kernel closes a dead process's pipes. The
rendezvous obeys ENGRAM_DIST_TIMEOUT_S like every other wait. A rank that dies without reporting ends the
run at once: the launcher sees its pipe close, stops the others (they would wait for it until their
timeouts) and says which rank died. A rank whose caller dies (even by kill -9) exits within a second
(_exit_with_caller), and the fork server dies with the caller (fork_server)."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from engram.errors import ConfigError, EngramError
from engram.runtime.dist import parse_timeout, timeout_s
from engram.runtime.fork_server import CALLER_ENV

# Imported once by the fork server: first what makes it die with its caller, then torch, torch.distributed
# and the runtime.
PRELOAD = ["engram.runtime.fork_server", "engram.runtime.engine"]


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


CALLER_POLL_MS = 1000
ORPHANED = 70  # a rank's exit status when its caller died: nobody is left to read its result


def _exit_with_caller(results: Connection, done: threading.Event) -> None:
    """End this rank when the caller is gone. The caller holds the only read end of the rank's result
    pipe, so its death, however it died, shows on the write end as POLLERR; no signal and no parent pid
    to trust (the rank's parent is the fork server, which outlives the caller by seconds)."""
    poller = select.poll()
    poller.register(results.fileno(), 0)  # POLLERR and POLLHUP are reported whatever is asked
    while not done.is_set():
        events = poller.poll(CALLER_POLL_MS)
        if any(event & (select.POLLERR | select.POLLHUP) for _, event in events) and not done.is_set():
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
    except BaseException:  # report anything, so the parent never waits on a silent child
        outcome = Outcome(rank, error=traceback.format_exc())
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
        while open_ends and not died and time.monotonic() < deadline:
            for ready in wait(open_ends, timeout=max(0.0, min(0.5, deadline - time.monotonic()))):
                end = cast(Connection, ready)
                open_ends.remove(end)
                try:
                    outcome: Outcome = end.recv()
                    outcomes[outcome.rank] = outcome
                except (EOFError, OSError):  # died without reporting: its peers can only wait for it now
                    died.append(rank_of[end])
                end.close()
    finally:
        for p in procs:
            if not died:  # reported, or past the deadline: a moment to exit by itself
                p.join(timeout=max(0.0, min(10.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()
            p.join(timeout=10)
        for end in open_ends:
            end.close()
    for rank, p in enumerate(procs):
        if rank in outcomes:
            outcomes[rank] = Outcome(rank, outcomes[rank].value, outcomes[rank].error, p.exitcode)
            continue
        if rank in died:
            reason = f"rank {rank} died with exit code {p.exitcode} before reporting"
        elif died:
            first = died[0]
            reason = (
                f"rank {rank} was stopped: rank {first} died with exit code {procs[first].exitcode} before reporting"
            )
        else:
            reason = f"rank {rank} timed out before reporting"
        outcomes[rank] = Outcome(rank, error=reason, exitcode=p.exitcode)
    return [outcomes[r] for r in range(world)]


def values(outcomes: list[Outcome]) -> list[Any]:
    """The ranks' return values, or one EngramError that lists every rank's failure."""
    failed = [o for o in outcomes if o.error is not None]
    if failed:
        raise EngramError("; ".join(f"rank {o.rank}: {o.error}" for o in failed))
    return [o.value for o in outcomes]
