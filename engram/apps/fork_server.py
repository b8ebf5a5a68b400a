"""Imported first by the launcher's fork server (local_ranks.PRELOAD), before the imports that take it
seconds: it dies with its caller, at once. The caller's pid comes in CALLER_ENV; the kernel sends the
server SIGKILL when that process ends (PR_SET_PDEATHSIG), even while it imports, so a request the dead
caller left queued is never served: no rank is forked for a run nobody waits for. Imported anywhere but
inside a fork server's start (multiprocessing.forkserver.main), it does nothing."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

CALLER_ENV = "ENGRAM_LAUNCHER_PID"
PR_SET_PDEATHSIG = 1


def die_with_caller() -> None:
    """SIGKILL when the caller (CALLER_ENV) ends; an immediate exit if it is no longer this process's
    parent (it ended before the request was made). Nothing without CALLER_ENV."""
    caller = os.environ.get(CALLER_ENV, "")
    if not (caller.isascii() and caller.isdigit()):
        return
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return  # not Linux: the server notices its caller's end as multiprocessing does, later
    if os.getppid() != int(caller):
        os._exit(0)


def _starting_a_fork_server() -> bool:
    """Whether this import runs inside multiprocessing's fork server start (its preload)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "main" and frame.f_globals.get("__name__") == "multiprocessing.forkserver":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


if _starting_a_fork_server():
    die_with_caller()
