"""Who binds an abstract Unix socket name on this node: the kernel's sock_diag answer (NETLINK_SOCK_DIAG,
UDIAG_SHOW_NAME | UDIAG_SHOW_UID), which names each socket's owner uid. /proc/net/unix lists the same
names without owners, so a name found there says nothing about who made it: another user can bind any
name ours would take. None where the kernel lacks unix_diag (the callers then fall back, and say how)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
UDIAG_SHOW_NAME, UDIAG_SHOW_UID = 0x1, 0x40
UNIX_DIAG_NAME, UNIX_DIAG_UID = 0, 7
TCP_LISTEN = 10
HEADER = struct.Struct("=IHHII")  # nlmsghdr
REQUEST = struct.Struct("=BBHIIIII")  # unix_diag_req
MESSAGE = struct.Struct("=BBBBIII")  # unix_diag_msg
ATTRIBUTE = struct.Struct("=HH")  # rtattr
READ_S = 1.0  # the kernel answers a dump at once; a stuck answer is not waited for
MAX_SOCKETS = 1 << 20  # sockets looked at per dump: a node's own count is far below


@dataclass(frozen=True)
class Bound:
    name: str  # as /proc/net/unix shows it: "@" for the leading NUL
    uid: int
    listening: bool


def bound(prefix: str) -> list[Bound] | None:
    """Every stream socket of this network namespace whose abstract name starts with `prefix` ("@..."),
    with its owner; None when the kernel cannot say."""
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as sock:
            sock.settimeout(READ_S)
            body = REQUEST.pack(socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, UDIAG_SHOW_NAME | UDIAG_SHOW_UID, 0, 0)
            sock.sendto(
                HEADER.pack(HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body,
                (0, 0),
            )
            return _collect(sock, prefix.encode("latin-1"))
    except (OSError, struct.error):
        return None


def _collect(sock: socket.socket, prefix: bytes) -> list[Bound] | None:
    found: list[Bound] = []
    seen = 0
    while seen < MAX_SOCKETS:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + HEADER.size <= len(data):
            length, kind, _, _, _ = HEADER.unpack_from(data, offset)
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR or length < HEADER.size + MESSAGE.size or offset + length > len(data):
                return None
            seen += 1
            entry = _entry(data[offset + HEADER.size : offset + length], prefix)
            if entry is not None:
                found.append(entry)
            offset += (length + 3) & ~3
    return found


def _entry(message: bytes, prefix: bytes) -> Bound | None:
    _, kind, state, _, _, _, _ = MESSAGE.unpack_from(message)
    name, uid = b"", None
    at = MESSAGE.size
    while at + ATTRIBUTE.size <= len(message):
        size, attribute = ATTRIBUTE.unpack_from(message, at)
        if size < ATTRIBUTE.size:
            break
        value = message[at + ATTRIBUTE.size : at + size]
        if attribute == UNIX_DIAG_NAME:
            name = value
        elif attribute == UNIX_DIAG_UID and len(value) >= 4:
            uid = int.from_bytes(value[:4], "little")
        at += (size + 3) & ~3
    if kind != socket.SOCK_STREAM or uid is None or not name.startswith(b"\0"):
        return None
    shown = b"@" + name[1:]
    if not shown.startswith(prefix):
        return None
    return Bound(shown.decode("latin-1"), uid, state == TCP_LISTEN)
