"""The node agent (`engram node-agent`, one per node: a DaemonSet in Kubernetes terms): it loads the node
copies that engines ask it for (engram.runtime.placement.agent_requests), and holds and serves them in
the rendezvous directory. Their pages are touched first by the agent, so they are charged to its cgroup,
never to a serving pod's, and the copies outlive every serving pod.

A request is refused, with the reason, when the agent's memory (the least any cgroup it is in has left,
and the node's) cannot hold the copy, when the files hold other rows than the engine's key says, or when
the files cannot be shared (a writer maps one). The agent computes the key from the files it was given,
so it never serves rows of another file. On its start it adopts every copy engines of the directory
still serve (it maps them and serves them too), so a restart loses none; it marks the directory as
served by an agent, so engines wait for it while it restarts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import threading
from pathlib import Path
from typing import Any

from engram.errors import EngramError
from engram.memory.host import free_bytes_now
from engram.memory.mapping import PAGE, round_up
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.agent_requests import MAX_FILES, REQUEST_LIMIT, Wanted
from engram.runtime.placement.node_copy import obtain_rows
from engram.runtime.placement.node_sharing import Copy, adopt, peer
from engram.runtime.placement.rendezvous import AGENT_PREFIX, rendezvous
from engram.runtime.shard import ShardFormat

log = logging.getLogger("engram")
ACCEPT_S = 1.0  # how often the loop looks at `stop`


class NodeAgent:
    """An agent serving the rendezvous directory `node_dir` (module docstring)."""

    def __init__(self, node_dir: str) -> None:
        self.node_dir = node_dir
        self.directory = rendezvous(node_dir)
        self.held: dict[str, Copy] = adopt(node_dir)  # by key digest
        self.directory.mark_agent()
        self.listener = self.directory.listen(AGENT_PREFIX)

    def serve(self, stop: threading.Event | None = None) -> None:
        """Answer engines' requests, one at a time, until `stop` is set (or forever)."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.listener, selectors.EVENT_READ)
            while stop is None or not stop.is_set():
                if not selector.select(timeout=ACCEPT_S):
                    continue
                with contextlib.suppress(BlockingIOError):
                    conn, _ = self.listener.accept()
                    with conn:
                        self._answer(conn)

    def close(self) -> None:
        self.directory.close(self.listener)

    def _answer(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(5.0)
        fds: list[int] = []
        try:
            if peer(conn)[1] != os.geteuid():
                return  # another uid: nothing read, nothing said
            data, fds, _, _ = socket.recv_fds(conn, REQUEST_LIMIT, MAX_FILES)
            while len(data) < REQUEST_LIMIT and (more := conn.recv(REQUEST_LIMIT - len(data))):
                data += more
            conn.settimeout(None)  # a load takes what it takes; the engine bounds its own wait
            told = self._serve(Wanted.parse(data), fds)
        except (ValueError, TypeError) as exc:
            told = {"refused": f"a request engram cannot read: {exc}"}
        except OSError as exc:
            log.warning("engram: node agent: a request failed: %s", exc)
            return
        finally:
            for fd in fds:
                os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(told).encode())

    def _serve(self, wanted: Wanted, fds: list[int]) -> dict[str, Any]:
        """Load (or find) the copy `wanted` from the files at `fds`, and keep it."""
        fmt = ShardFormat(wanted.rows, wanted.dim, wanted.dtype)
        total = round_up(fmt.nbytes, PAGE) + PAGE
        if wanted.digest in self.held:
            return {"served": True}
        free = free_bytes_now()
        if total > free:
            return {
                "refused": f"the node agent has {free:,} bytes of memory left (its cgroup's limit less its use, "
                f"and the node's), and the copy takes {total:,}: raise the agent's memory limit"
            }
        try:
            checkpoint = Checkpoint.of_files([Path(f"/proc/self/fd/{fd}") for fd in fds])
            copy, key = obtain_rows(
                checkpoint, wanted.table, fmt, wanted.row_start, wanted.table_rows, node=wanted.numa_node,
                node_dir=self.node_dir, progress=False, agent=False, expected=wanted.digest,
            )  # fmt: skip
        except EngramError as exc:  # the files, their writers, the key, the memory: said to the engine
            return {"refused": str(exc)}
        self.held[key.digest] = copy
        log.info("engram: node agent: %s (%s)", key.describe, copy.note)
        return {"served": True}
