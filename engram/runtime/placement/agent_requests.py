"""An engine's side of the node agent (engram.runtime.placement.node_agent): where a rendezvous directory
says an agent serves it, an engine that finds no copy asks the agent to load one, passing the descriptors
of the checkpoint files that hold the rows (so the agent needs no mount of the model, and reads exactly
the files the engine opened) and what it wants: the table, its rows and format, their NUMA node, and
the key it computed. The agent computes the key from those files itself and never serves other rows.

An agent that is down or restarting is waited for, up to AGENT_WAIT_S, then the engine loads its own;
either way the engine never fails to start for the agent's sake: a refusal or a silence is one warning."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engram.errors import EngramError
from engram.runtime.checkpoints.files import open_regular
from engram.runtime.dist import parse_timeout
from engram.runtime.placement.node_sharing import peer
from engram.runtime.placement.rendezvous import AGENT_PREFIX, Rendezvous

AGENT_WAIT_S = 30.0  # the most an engine waits for a restarting agent before it loads its own (ENGRAM_AGENT_WAIT_S)
POLL_S = 0.05
REQUEST_LIMIT = 64 << 10
MAX_FILES = 64  # checkpoint files holding one table's rows: a few at most


_gone: set[str] = set()  # directories whose agent this process waited for in vain
NOT_RUNNING = "the node agent of {path} is not running (this engine waited for it once)"


@dataclass(frozen=True)
class Wanted:
    """Rows [row_start, row_start + rows) of `table` (of `table_rows`), as `dtype` x `dim`, for NUMA node
    `numa_node` (None: one copy per machine), whose key is `digest`."""

    table: str
    rows: int
    dim: int
    dtype: str
    row_start: int
    table_rows: int
    numa_node: int | None
    digest: str

    @classmethod
    def parse(cls, data: bytes) -> Wanted:
        told = json.loads(data)
        if not isinstance(told, dict) or set(told) != set(cls.__dataclass_fields__):
            raise ValueError("not a request")
        wanted = cls(**told)
        numbers = (wanted.rows, wanted.dim, wanted.row_start, wanted.table_rows)
        if not all(type(n) is int and n >= 0 for n in numbers) or not isinstance(wanted.table, str):
            raise ValueError("not a request")
        if not (wanted.numa_node is None or type(wanted.numa_node) is int) or not isinstance(wanted.digest, str):
            raise ValueError("not a request")
        return wanted


def ask_agent(directory: Rendezvous, wanted: Wanted, files: list[Path], deadline: float) -> str | None:
    """Ask the directory's node agent for the copy `wanted` (from `files`), and wait for its answer until
    `deadline` (time.monotonic()): None once it serves the copy, else why not (said by the caller, who
    then loads its own; a reason in `_gone`'s words was said once already). An agent not listening now
    is waited for once per process, up to AGENT_WAIT_S (ENGRAM_AGENT_WAIT_S)."""
    raw = os.environ.get("ENGRAM_AGENT_WAIT_S")
    wait_s = AGENT_WAIT_S if raw is None else parse_timeout(raw, "ENGRAM_AGENT_WAIT_S")
    waited_until = min(deadline, time.monotonic() + wait_s)
    while not (agents := directory.servers(AGENT_PREFIX)):
        if directory.path in _gone:  # waited for once already: this process's other tables do not wait again
            return NOT_RUNNING.format(path=directory.path)
        if time.monotonic() >= waited_until:
            _gone.add(directory.path)
            return f"the node agent of {directory.path} did not come up in {wait_s:g} s (down or restarting)"
        time.sleep(POLL_S)
    _gone.discard(directory.path)
    fds = [open_regular(f, "checkpoint file") for f in files[:MAX_FILES]]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            sock.connect(agents[0])
            if peer(sock)[1] != os.geteuid():
                return "a node agent of another uid answered"  # not possible in a directory of ours; checked anyway
            socket.send_fds(sock, [json.dumps(asdict(wanted)).encode()], fds)
            sock.shutdown(socket.SHUT_WR)
            answer = _read_all(sock)
    except OSError as exc:
        return f"the node agent of {directory.path} did not answer: {exc.strerror or exc}"
    except EngramError as exc:
        return str(exc)
    finally:
        for fd in fds:
            os.close(fd)
    try:
        told: Any = json.loads(answer)
    except ValueError:
        return f"the node agent of {directory.path} gave no answer"
    if isinstance(told, dict) and told.get("served") is True:
        return None
    why = told.get("refused") if isinstance(told, dict) else None
    return f"the node agent refused: {str(why)[:500]}"


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while len(data) < REQUEST_LIMIT and (chunk := sock.recv(REQUEST_LIMIT - len(data))):
        data += chunk
    return data
