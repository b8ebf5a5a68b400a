"""A shared table as an anonymous memfd handed to the node's replicas over an abstract Unix socket
(SCM_RIGHTS): nothing has a name in any directory, so no crash at any instant can leak it; the kernel
frees it with the last fd or mapping. The protocol is in engram/runtime/placement/shm.py's docstring."""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import selectors
import socket
import threading
import time
from typing import Any

from engram.errors import EngramError
from engram.memory.host import HostLimits, read_host_limits
from engram.memory.mapping import Mapping, map_shared_file
from engram.runtime.dist import Group, all_gather_json, broadcast_json
from engram.runtime.placement.node_memory import GIB, fenced, node_of_this_process, reserve

HELLO = b"engram-table"


def _identity() -> dict[str, Any]:
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = "unknown"
    return {"uid": os.getuid(), "boot_id": node_of_this_process(), "netns": netns}


def capacity_error(size: int, limits: HostLimits | None = None) -> str | None:
    """Why the node's memory cannot hold a shared table of `size` bytes, or None."""
    available = (limits or read_host_limits()).available
    if size <= available:
        return None
    return (
        f"the node has {available:,} bytes of memory available but the shared table needs {size:,} "
        f"({(size - available) / GIB:.2f} GiB more); free memory, raise the container's memory limit, or turn dp_shared_memory off"
    )


def _create(size: int, tag: str) -> tuple[int | None, str | None]:
    """The leader's memfd with its space reserved, or the error."""
    error = capacity_error(size)
    if error:
        return None, error
    try:
        fd = os.memfd_create(f"engram-{tag}", os.MFD_CLOEXEC)
    except OSError as exc:
        return None, f"memfd_create failed: {exc.strerror}; set ENGRAM_SHM_DIR to share tables through a tmpfs instead"
    failed = reserve(fd, size)
    if failed:
        os.close(fd)
        return (
            None,
            f"cannot reserve {size:,} bytes of shared memory: {failed}; free memory or turn dp_shared_memory off",
        )
    return fd, None


PENDING_MAX = 64  # connections of our uid still owing the token; more are refused, so none can pile up
PROOF_S = 5.0  # how long one of them may take to send it
BACKLOG = 256  # strangers of another uid are dropped at accept, so the queue drains as fast as they fill it

Pending = dict[socket.socket, tuple[float, bytearray]]  # connection -> (deadline, token bytes so far)


def _peer_uid(conn: socket.socket) -> int:
    return int.from_bytes(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)[4:8], "little")


def _serve(listener: socket.socket, fd: int, token: bytes, uid: int, expected: int, stop: threading.Event) -> None:
    """The leader's hand-off thread: give `fd` to `expected` peers, each proving it is one by sending the
    group's token (which only the group was told) from our uid. The uid is checked at accept, before
    anything is read (SO_PEERCRED); connections of our uid are served side by side, so a silent one
    delays no other. It stops when all are served or at `stop` (set after the fence, which tells the
    leader at once of a peer that failed). Pids are not compared: replicas in one pod share a network
    namespace but not always a pid namespace."""
    pending: Pending = {}
    listener.setblocking(False)
    served = 0
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        while served < expected and not stop.is_set():
            for key, _ in selector.select(timeout=0.05):
                if key.fileobj is listener:
                    _admit(listener, uid, pending, selector)
                    continue
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                _, got = pending[conn]
                try:
                    chunk = conn.recv(len(token) - len(got))
                except OSError:
                    chunk = b""
                got += chunk
                if chunk and len(got) < len(token):
                    continue
                if chunk and hmac.compare_digest(bytes(got), token):
                    with contextlib.suppress(OSError):
                        conn.setblocking(True)
                        conn.settimeout(1.0)
                        socket.send_fds(conn, [HELLO], [fd])
                        served += 1
                _drop(conn, pending, selector)
            now = time.monotonic()
            for conn in [c for c, (until, _) in pending.items() if until < now]:
                _drop(conn, pending, selector)
        for conn in list(pending):
            _drop(conn, pending, selector)


def _admit(listener: socket.socket, uid: int, pending: Pending, selector: selectors.BaseSelector) -> None:
    """Accept what is queued: another uid's connection is closed at once, unread."""
    while True:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return
        try:
            ours = _peer_uid(conn) == uid and len(pending) < PENDING_MAX
        except OSError:  # it hung up already
            ours = False
        if not ours:
            conn.close()
            continue
        conn.setblocking(False)
        pending[conn] = (time.monotonic() + PROOF_S, bytearray())
        selector.register(conn, selectors.EVENT_READ)


def _drop(conn: socket.socket, pending: Pending, selector: selectors.BaseSelector) -> None:
    selector.unregister(conn)
    pending.pop(conn, None)
    conn.close()


def _receive(name: str, token: bytes, deadline: float) -> tuple[int | None, str | None]:
    """A peer's step: connect (again while the leader's queue is full or it turned us away) and take the fd."""
    while True:
        fd, error, retry = _receive_once(name, token, deadline)
        if not retry or time.monotonic() >= deadline:
            return fd, error
        time.sleep(0.05)


def _receive_once(name: str, token: bytes, deadline: float) -> tuple[int | None, str | None, bool]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.connect(name)
            sock.sendall(token)
            message, fds, _, _ = socket.recv_fds(sock, len(HELLO), 1)
        except (BlockingIOError, InterruptedError, ConnectionResetError, BrokenPipeError):
            return None, "the leader's hand-off socket stayed full until the timeout", True
        except (OSError, TimeoutError) as exc:
            return (
                None,
                (
                    f"cannot receive the shared table from the leader: {getattr(exc, 'strerror', None) or exc}; the replicas of a node "
                    "must share one network namespace (one pod, or the host's), or set ENGRAM_SHM_DIR to share through a tmpfs"
                ),
                False,
            )
    if message == HELLO and len(fds) == 1:
        return fds[0], None, False
    for extra in fds:
        os.close(extra)
    if not message and not fds:
        return None, "the leader's hand-off socket kept turning this replica away until the timeout", True
    return None, "the leader's socket answered with something other than the table", False


def _same_node(peer: dict[str, Any], leader: dict[str, Any]) -> bool:
    """Whether `peer` can reach the leader's abstract socket and be served: one node, network namespace, uid."""
    return all(peer[k] == leader[k] for k in ("boot_id", "netns", "uid"))


def _peer_fd(
    me: dict[str, Any], leader: dict[str, Any], announced: dict[str, Any], group: Group, deadline: float
) -> tuple[int | None, str | None]:
    rank = group.ranks[group.rank]
    if me["boot_id"] != leader["boot_id"]:
        return None, (
            f"rank {rank} runs on another node than its leader (boot id differs); dp_shared_memory needs "
            "data_parallel_size_local to match the replicas per node"
        )
    if not _same_node(me, leader):
        return None, (
            f"rank {rank} runs in another network namespace or as another user than its leader; run the replicas "
            "in one pod (or on the host's namespaces) as one user, or set ENGRAM_SHM_DIR"
        )
    return _receive(announced["name"], (announced["token"] or "").encode(), deadline)


def share_memfd(size: int, group: Group, tag: str) -> Mapping:
    """Collective over `group`: every rank gets a MAP_SHARED mapping of one memfd of `size` bytes."""
    deadline = time.monotonic() + group.timeout
    everyone = all_gather_json(group, _identity(), f"shared table {tag}: identities")
    me, leader = everyone[group.rank], everyone[0]
    fd: int | None = None
    listener: socket.socket | None = None
    stop = threading.Event()
    server: threading.Thread | None = None
    try:
        announced: dict[str, Any] = {"name": None, "token": None, "error": None}
        if group.rank == 0:
            fd, announced["error"] = _create(size, tag)
            if fd is not None and group.size > 1:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                announced["name"] = f"\0engram-{secrets.token_hex(16)}"
                announced["token"] = secrets.token_hex(32)
                listener.bind(announced["name"])
                listener.listen(BACKLOG)
                reachable = sum(1 for p in everyone[1:] if _same_node(p, leader))
                server = threading.Thread(
                    target=_serve,
                    args=(listener, fd, announced["token"].encode(), me["uid"], reachable, stop),
                    name=f"engram-handoff-{tag}"[:60],
                    daemon=True,
                )
                server.start()
        announced = broadcast_json(group, announced, f"shared table {tag}: announce")
        if announced["error"]:
            raise EngramError(
                f"{group.label}: leader rank {group.ranks[0]} could not create the shared table {tag}: {announced['error']}"
            )
        error = None
        if group.rank != 0:  # the leader's fd is its own: its hand-off thread serves while it waits in the fence
            fd, error = _peer_fd(me, leader, announced, group, deadline)
        mapping = None
        if fd is not None and error is None:
            try:
                label = (announced["name"] or "alone").lstrip("\0")  # abstract socket names start with a NUL
                mapping = map_shared_file(fd, size, f"memfd:engram-{tag}:{label}"[:200])
            except EngramError as exc:
                error = str(exc)
        return fenced(group, all_gather_json(group, error, f"shared table {tag}: attach"), mapping)  # the fence
    finally:
        stop.set()
        if server is not None:
            server.join(timeout=5.0)
        if listener is not None:
            listener.close()  # the abstract name goes with it
        if fd is not None:
            os.close(fd)  # the mappings keep the memory
