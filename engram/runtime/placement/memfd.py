"""A shared table as an anonymous memfd handed to the node's replicas over an abstract Unix socket
(SCM_RIGHTS): nothing has a name in any directory, so no crash at any instant can leak it; the kernel
frees it with the last fd or mapping. The protocol is in engram/runtime/placement/shm.py's docstring."""

from __future__ import annotations

import hmac
import os
import secrets
import socket
import time
from typing import Any

from engram.errors import EngramError
from engram.memory.host import HostLimits, read_host_limits
from engram.memory.mapping import Mapping, map_shared_file
from engram.runtime.dist import Group, all_gather_json, broadcast_json
from engram.runtime.placement.node import GIB, fenced, node_of_this_process, reserve

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


def _serve(listener: socket.socket, fd: int, token: bytes, uid: int, expected: int, deadline: float) -> str | None:
    """Hand `fd` to `expected` peers, each proving it is one by sending the group's token (which only
    the group was told) from our uid (SO_PEERCRED); None, or what went wrong. Pids are not compared:
    replicas in one pod share a network namespace but not always a pid namespace."""
    served = 0
    while served < expected:
        listener.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            return f"{expected - served} of the group's replicas never came for the shared table"
        with conn:
            conn.settimeout(max(0.01, min(5.0, deadline - time.monotonic())))
            try:
                creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                proof = conn.recv(len(token), socket.MSG_WAITALL)
                if int.from_bytes(creds[4:8], "little") != uid or not hmac.compare_digest(proof, token):
                    continue  # not one of the group: it gets nothing
                socket.send_fds(conn, [HELLO], [fd])
            except (OSError, TimeoutError):
                continue  # a stranger that hung up or stalled; a real peer that failed reports through the fence
            served += 1
    return None


def _receive(name: str, token: bytes, deadline: float) -> tuple[int | None, str | None]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            sock.connect(name)
            sock.sendall(token)
            message, fds, _, _ = socket.recv_fds(sock, len(HELLO), 1)
        except (OSError, TimeoutError) as exc:
            return None, (
                f"cannot receive the shared table from the leader: {getattr(exc, 'strerror', None) or exc}; the replicas of a node "
                "must share one network namespace (one pod, or the host's), or set ENGRAM_SHM_DIR to share through a tmpfs"
            )
    if message != HELLO or len(fds) != 1:
        for extra in fds:
            os.close(extra)
        return None, "the leader's socket answered with something other than the table"
    return fds[0], None


def _same_node(peer: dict[str, Any], leader: dict[str, Any]) -> bool:
    """Whether `peer` can reach the leader's abstract socket and be served: one node, network namespace, uid."""
    return all(peer[k] == leader[k] for k in ("boot_id", "netns", "uid"))


def share_memfd(size: int, group: Group, tag: str) -> Mapping:
    """Collective over `group`: every rank gets a MAP_SHARED mapping of one memfd of `size` bytes."""
    deadline = time.monotonic() + group.timeout
    everyone = all_gather_json(group, _identity(), f"shared table {tag}: identities")
    me, leader = everyone[group.rank], everyone[0]
    fd: int | None = None
    listener: socket.socket | None = None
    try:
        announced: dict[str, Any] = {"name": None, "token": None, "error": None}
        if group.rank == 0:
            fd, announced["error"] = _create(size, tag)
            if fd is not None and group.size > 1:
                listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
                announced["name"] = f"\0engram-{secrets.token_hex(16)}"
                announced["token"] = secrets.token_hex(32)
                listener.bind(announced["name"])
                listener.listen(group.size)
        announced = broadcast_json(group, announced, f"shared table {tag}: announce")
        if announced["error"]:
            raise EngramError(
                f"{group.label}: leader rank {group.ranks[0]} could not create the shared table {tag}: {announced['error']}"
            )
        error = None
        token = (announced["token"] or "").encode()
        if group.rank == 0:
            if listener is not None:
                assert fd is not None
                reachable = sum(1 for p in everyone[1:] if _same_node(p, leader))
                error = _serve(listener, fd, token, me["uid"], reachable, deadline)
        elif me["boot_id"] != leader["boot_id"]:
            error = f"rank {group.ranks[group.rank]} runs on another node than its leader (boot id differs); dp_shared_memory needs data_parallel_size_local to match the replicas per node"
        elif not _same_node(me, leader):
            error = f"rank {group.ranks[group.rank]} runs in another network namespace or as another user than its leader; run the replicas in one pod (or on the host's namespaces) as one user, or set ENGRAM_SHM_DIR"
        else:
            fd, error = _receive(announced["name"], token, deadline)
        mapping = None
        if fd is not None and error is None:
            try:
                label = (announced["name"] or "alone").lstrip("\0")  # abstract socket names start with a NUL
                mapping = map_shared_file(fd, size, f"memfd:engram-{tag}:{label}"[:200])
            except EngramError as exc:
                error = str(exc)
        return fenced(group, all_gather_json(group, error, f"shared table {tag}: attach"), mapping)  # the fence
    finally:
        if listener is not None:
            listener.close()  # the abstract name goes with it
        if fd is not None:
            os.close(fd)  # the mappings keep the memory
