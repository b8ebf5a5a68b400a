"""The local launcher: nothing left behind when a run is killed, and every wait, the rendezvous included,
bounded by ENGRAM_DIST_TIMEOUT_S, ending in one line per rank."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil
import pytest

from engram.apps.local_ranks import run_local
from tests.runtime import workers

ROOT = Path(__file__).resolve().parents[2]


def semaphores() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("sem.")}


@pytest.mark.slow
def test_a_killed_demo_leaves_no_semaphores_and_no_processes() -> None:
    before = semaphores()
    demo = subprocess.Popen(
        [sys.executable, "-m", "engram", "demo", "--preset", "tiny"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    parent = psutil.Process(demo.pid)
    deadline = time.monotonic() + 60
    while len(parent.children()) < 2 and time.monotonic() < deadline:  # the replicas are up
        time.sleep(0.05)
    family = [parent, *parent.children(recursive=True)]
    assert len(family) >= 3
    during = semaphores()
    os.killpg(demo.pid, signal.SIGKILL)
    demo.wait(timeout=30)
    psutil.wait_procs(family, timeout=30)
    assert during == before and semaphores() == before  # pipes, not multiprocessing queues
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family)


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_a_rank_killed_before_the_rendezvous_ends_the_run_at_once(victim: int) -> None:
    """The launcher sees the dead rank's pipe close and stops the survivor, which would wait for it until
    ENGRAM_DIST_TIMEOUT_S (300 s here, past the run's own 120 s: a survivor left to wait would be "timed
    out"), with one line each; nothing of the run is left."""

    def kill_early(procs: Sequence[object]) -> None:
        os.kill(procs[victim].pid, signal.SIGKILL)  # type: ignore[attr-defined]  # at once: it is still starting

    outcomes = run_local(2, workers.meet, timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "300"}, on_start=kill_early)
    dead, survivor = outcomes[victim], outcomes[1 - victim]
    assert dead.exitcode == -9 and dead.error == f"rank {victim} died with exit code -9 before reporting"
    assert survivor.error == f"rank {1 - victim} was stopped: rank {victim} died with exit code -9 before reporting"


@pytest.mark.slow
def test_a_run_that_succeeds_leaves_nothing() -> None:
    before = semaphores()
    outcomes = run_local(3, workers.meet, timeout=120)
    assert [o.value for o in outcomes] == [0, 1, 2] and all(o.exitcode == 0 for o in outcomes)
    assert semaphores() == before


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e-9", "0.5", "1e12", "abc", "0"])
def test_a_bad_timeout_is_one_line(value: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "engram", "demo", "--preset", "tiny"],
        cwd=ROOT,
        env={**os.environ, "ENGRAM_DIST_TIMEOUT_S": value},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: ENGRAM_DIST_TIMEOUT_S={value!r} "
        + ("is not a number of seconds" if value == "abc" else "must be between 1 and 604800 seconds")
    ]


CALLER = """
import sys
from engram.apps.local_ranks import run_local
from tests.runtime import workers
run_local(2, workers.sleep_long, timeout=600, on_start=lambda procs: print(*[p.pid for p in procs], flush=True))
"""


@pytest.mark.slow
def test_ranks_end_within_seconds_of_their_callers_death() -> None:
    """The caller killed alone (kill -9, nothing else): its ranks, children of the fork server, exit by
    themselves long before ENGRAM_DIST_TIMEOUT_S (here 300 s) or their own work (600 s) would end them."""
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER], cwd=ROOT, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "ENGRAM_DIST_TIMEOUT_S": "300"}, start_new_session=True,
    )  # fmt: skip
    assert caller.stdout is not None
    ranks = [psutil.Process(int(pid)) for pid in caller.stdout.readline().split()]
    assert len(ranks) == 2 and all(r.is_running() for r in ranks)
    server = ranks[0].parent()
    caller.kill()
    caller.wait(timeout=30)
    caller.stdout.close()
    _, alive = psutil.wait_procs(ranks, timeout=60)
    assert not alive, [p.pid for p in alive]
    if server is not None:
        psutil.wait_procs([server], timeout=60)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE


# Runs the demo's launcher with its own fork server (none is running in this fresh process) and prints
# nothing: the test finds the fork server among its children.
SLOW_START = """
from engram.apps.local_ranks import run_local
from tests.runtime import workers
run_local(2, workers.meet, timeout=600)
"""


def fork_server_of(parent: psutil.Process) -> psutil.Process | None:
    """`parent`'s child that is a multiprocessing fork server, if one is running (a child that exits as it
    is looked at is none)."""
    for child in parent.children():
        with contextlib.suppress(psutil.NoSuchProcess):  # ZombieProcess among them
            if "forkserver" in " ".join(child.cmdline()):
                return child
    return None


@pytest.mark.slow
def test_a_caller_killed_while_its_fork_server_imports_leaves_no_server_and_forks_no_rank() -> None:
    """kill -9 of the caller while its fork server still imports torch and the engine (its request to
    fork rank 0 queued): the server dies with it, and forks no rank for the run nobody waits for."""
    with subprocess.Popen(
        [sys.executable, "-c", SLOW_START], cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True
    ) as caller:
        parent = psutil.Process(caller.pid)
        deadline = time.monotonic() + 120
        server = None
        while server is None and time.monotonic() < deadline:
            server = fork_server_of(parent)
            time.sleep(0.01)
        assert server is not None, "no fork server appeared"
        time.sleep(0.5)  # it imports its preload for seconds on this machine
        before: set[int] = set()
        with contextlib.suppress(psutil.NoSuchProcess):
            before = {p.pid for p in server.children()}  # none while it imports; any forked before the kill are fair
        caller.kill()
        caller.wait(timeout=30)
    forked: set[int] = set()
    deadline = time.monotonic() + 60
    with contextlib.suppress(psutil.NoSuchProcess):  # ZombieProcess included: it is gone once it is one
        while server.is_running() and server.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            forked |= {p.pid for p in server.children()} - before
            time.sleep(0.005)
    assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    assert forked == set(), "the fork server forked a rank after its caller died"
