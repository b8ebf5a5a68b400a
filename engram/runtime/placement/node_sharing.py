"""One copy of a table shard for every engine process of this user on the node (node_sharing).

A copy is an anonymous memfd: nothing names it in any directory, and the kernel frees it with the last fd
or mapping, so no kill at any instant leaves it behind. It is known by a key, a digest of what it holds
(the digests of its rows' bytes in the checkpoint, the tensors' names, shapes and dtypes, its rows, its
row format, the NUMA node; ShareKey, node_copy.share_key), never by a path or a name.

- Every process that maps copies serves them on one abstract Unix socket, @engram-node-<uid>-<random>,
  from a thread. Abstract names vanish with their socket; a process of another uid is dropped at accept,
  before anything is read (SO_PEERCRED).
- An engine that needs a shard lists the node's such sockets of its uid (the kernel's sock_diag names
  each one's owner, so another user's names hide none of ours; without it, each listener is asked with
  a connection's SO_PEERCRED; its network namespace), checks the server's uid again before it sends
  anything, and asks for the key.
  It gets the memfd (SCM_RIGHTS) and checks it: an engram memfd of its uid, sealed against writes,
  shrinking and growing, of the size the key's shard takes, whose trailer page names the key.
- Found nowhere, it takes the key's load lock (binding @engram-load-<uid>-<key>: atomic, and gone with
  its holder), asks once more, loads into a private memfd, drops its writable mapping, seals the memfd
  (F_SEAL_WRITE, F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL), maps it read-only and serves it. The others
  wait for the copy or the lock, polling, until the timeout. A lock bound by another uid, or by one that
  never answers a connect (bound without listening, a full queue), is a squatter's: that engine loads
  without it at once.
- Pids are the kernel's (SO_PEERCRED, translated into our pid namespace); a pid a server reports of
  itself is used only when it shares our pid namespace.

Nothing is attached before it is sealed, so no engine sees a partial table; the copy lives while any
process maps it, and any of them hands it on. There is no helper process and no owner to lose.

Engines meet in their network namespace as above (AbstractPlace), or, with node_dir, in a rendezvous
directory any namespaces can share (DirectoryPlace: engram.runtime.placement.rendezvous names the servers
and load locks there); the protocol over either is the same."""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import gc
import hashlib
import json
import logging
import os
import secrets
import selectors
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch

from engram.errors import EngramError
from engram.memory.mapping import PAGE, Mapping, map_sealed_file, map_shared_file, round_up
from engram.runtime.checkpoints.files import open_for_writing, open_regular
from engram.runtime.placement import abstract_names
from engram.runtime.placement.memfd import capacity_error
from engram.runtime.placement.node_memory import reserve
from engram.runtime.placement.numa import preferring
from engram.runtime.placement.rendezvous import rendezvous
from engram.scratch import proc_is_ours

log = logging.getLogger("engram")

VERSION = b"engram-node-copy-1"
SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
MEMFD_PREFIX = "memfd:engram-node-"
REQUEST = 1 + 64 + 64  # b"Q" + key digest + family digest, or b"L" + padding: a listing
ANSWER_LIMIT = 64 << 10
MAX_SERVERS = 256  # our own copy servers tried per attach: one per engine process of ours on the node
CONNECT_S = 1.0  # per server: each answers from a thread in microseconds; a stopped one costs this
POLL_S = 0.05
SILENT_S = 2.0  # a lock holder whose queue takes no connect this long is not ours (where uids are unknown)
UNLISTENING_S = 0.25  # a lock bound this long without listening is not ours (ours listen as they bind)
Stage = Callable[[str], None]  # told "locked", "loaded", "sealed", "serving", "handing over" (tests kill there)


@dataclass(frozen=True)
class ShareKey:
    """What a copy holds: `digest` names it exactly; `family` (the checkpoint and table alone) finds the
    copies of other rows or formats, so an engine that cannot use them can say why."""

    digest: str
    family: str
    describe: str  # "rows [0, 1,000) of 1,000 of t0 as bfloat16 (one copy per node)", for people

    @classmethod
    def of(cls, source: Any, table: str, table_rows: int, shard: dict[str, Any]) -> ShareKey:
        """`source`: what names the checkpoint's tensors of `table` (names, shapes, dtypes); `shard`: its
        rows, row format, NUMA node (numa_node None: one copy for the machine) and their bytes' digests."""
        family = _digest({"source": source, "table": table, "table_rows": table_rows})
        full = _digest({"family": family, **shard})
        where = f"NUMA node {shard['numa_node']}" if shard.get("numa_node") is not None else "the node"
        rows = f"rows [{shard['row_start']:,}, {shard['row_start'] + shard['rows']:,}) of {table_rows:,}"
        return cls(full, family, f"{rows} of {table} as {shard['dtype']} x {shard['dim']} (one copy for {where})")


def _digest(value: Any) -> str:
    return hashlib.sha256(VERSION + json.dumps(value, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Copy:
    """A node copy mapped here: `loaded_by` is the pid that loaded it (this one, if it did)."""

    mapping: Mapping
    loaded_by: int
    attached: bool
    note: str = ""


@dataclass(eq=False)
class _Entry:
    fd: int
    key: ShareKey
    size: int
    loaded_by: int
    stage: Stage | None


def peer(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end (SO_PEERCRED: fixed when it connected or listened)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    return int.from_bytes(raw[0:4], "little"), int.from_bytes(raw[4:8], "little")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class Lock(NamedTuple):
    """A load lock held: in the network namespace a bound name's listening socket (a waiter learns the
    holder from a connection's SO_PEERCRED); in a rendezvous directory a locked file's descriptor."""

    sock: socket.socket | None
    fd: int | None


class AbstractPlace:
    """Where engines meet in one network namespace: abstract Unix socket names (module docstring)."""

    key = "abstract"

    def listen(self) -> socket.socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(f"\0engram-node-{os.geteuid()}-{secrets.token_hex(12)}")
        listener.listen(64)
        listener.setblocking(False)
        return listener

    def close(self, listener: socket.socket) -> None:
        listener.close()  # its name goes with it

    def servers(self) -> list[str]:
        return servers()

    def lock(self, digest: str) -> Lock | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(lock_name(digest))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None
            raise EngramError(f"cannot take the load lock of a node-shared table: {exc.strerror}") from None
        sock.listen(64)
        sock.setblocking(False)
        return Lock(sock, None)

    def unlock(self, digest: str, lock: Lock) -> None:
        assert lock.sock is not None
        lock.sock.close()

    def holder(self, digest: str) -> Holder | None:
        return _lock_holder(digest)

    def squatter(self, holder: Holder | None, silent_since: float | None) -> str | None:
        return _squatter(holder, silent_since)


class DirectoryPlace:
    """Where engines meet across namespaces: a rendezvous directory (engram.runtime.placement.rendezvous),
    which no other user can write, so no squatter: a lock's holder is ours, pid unknown (it may be in
    another pid namespace)."""

    def __init__(self, path: str) -> None:
        self.directory = rendezvous(path)
        self.key = f"directory {path}"

    def listen(self) -> socket.socket:
        return self.directory.listen()

    def close(self, listener: socket.socket) -> None:
        self.directory.close(listener)

    def servers(self) -> list[str]:
        return self.directory.servers()[:MAX_SERVERS]

    def lock(self, digest: str) -> Lock | None:
        fd = self.directory.lock(digest)
        return None if fd is None else Lock(None, fd)

    def unlock(self, digest: str, lock: Lock) -> None:
        assert lock.fd is not None
        self.directory.unlock(digest, lock.fd)

    def holder(self, digest: str) -> Holder | None:
        return Holder(None, os.geteuid(), True) if self.directory.locked(digest) else None

    def squatter(self, holder: Holder | None, silent_since: float | None) -> str | None:
        return None


Place = AbstractPlace | DirectoryPlace


def place_for(node_dir: str | None) -> Place:
    """Where this process's engines meet: the rendezvous directory `node_dir`, or the network namespace."""
    return _ABSTRACT if node_dir is None else DirectoryPlace(node_dir)


@dataclass(eq=False)
class _Server:
    """This process's copies at one place and the thread serving them (module docstring)."""

    place: Place
    entries: list[_Entry] = field(default_factory=list)  # a process may map one copy twice
    locks: dict[str, Lock] = field(default_factory=dict)
    listener: socket.socket | None = None
    thread: threading.Thread | None = None
    guard: threading.Lock = field(default_factory=threading.Lock)
    wake: tuple[socket.socket, socket.socket] | None = None
    hooked: bool = False  # _closed_at_exit registered

    def _ensure_thread(self) -> None:
        """Called under the guard."""
        if self.thread is not None and self.thread.is_alive():
            return
        self.wake = socket.socketpair()
        self.thread = threading.Thread(target=self._run, name="engram-node-copies", daemon=True)
        self.thread.start()

    def _nudge(self) -> None:
        if self.wake is not None:
            with contextlib.suppress(OSError):
                self.wake[0].send(b"x")

    def publish(self, entry: _Entry) -> str:
        """Serve `entry` from now on; returns the socket's name."""
        with self.guard:
            if self.listener is None:
                self.listener = self.place.listen()
                if not self.hooked:
                    atexit.register(self._closed_at_exit)
                    self.hooked = True
            self.entries.append(entry)
            self._ensure_thread()
            name = self.listener.getsockname()
        self._nudge()
        return str(name, "latin-1") if isinstance(name, bytes) else name

    def withdraw(self, entry: _Entry) -> None:
        """The copy is unmapped here: stop serving it, close its fd, and the socket with the last one."""
        with self.guard:
            if entry in self.entries:
                self.entries.remove(entry)
                os.close(entry.fd)
            if not self.entries and self.listener is not None:
                self.place.close(self.listener)
                self.listener = None
        self._nudge()

    def _closed_at_exit(self) -> None:
        """An exit leaves no name of ours behind (a rendezvous directory's socket file)."""
        with self.guard:
            if self.listener is not None:
                self.place.close(self.listener)
                self.listener = None

    def lock(self, digest: str) -> Lock | None:
        """Take the key's load lock, or None when someone holds it."""
        held = self.place.lock(digest)
        if held is None:
            return None
        with self.guard:
            self.locks[digest] = held
            self._ensure_thread()
        self._nudge()
        return held

    def unlock(self, digest: str) -> None:
        with self.guard:
            held = self.locks.pop(digest, None)
        if held is not None:
            self.place.unlock(digest, held)
        self._nudge()

    def _run(self) -> None:
        uid = os.geteuid()
        assert self.wake is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.wake[1], selectors.EVENT_READ)
            watched: set[socket.socket] = set()
            while True:
                with self.guard:
                    wanted = {s for s in [*(h.sock for h in self.locks.values()), self.listener] if s is not None}
                    if not wanted and not self.entries:
                        self.thread = None
                        self.wake[0].close()
                        self.wake[1].close()
                        self.wake = None
                        return
                for gone in watched - wanted:  # by object: a closed socket's fd number may be reused already
                    with contextlib.suppress(KeyError, ValueError, OSError):
                        selector.unregister(gone)
                for new in wanted - watched:
                    selector.register(new, selectors.EVENT_READ)
                watched = wanted
                for key, _ in selector.select(timeout=1.0):
                    if key.fileobj is self.wake[1]:
                        with contextlib.suppress(OSError):
                            self.wake[1].recv(4096)
                        continue
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    self._accept(sock, uid, is_lock=sock is not self.listener)

    def _accept(self, listener: socket.socket, uid: int, *, is_lock: bool) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # none left, or the listener closed under us
                return
            with conn:
                if is_lock:
                    continue  # a waiter learns the holder from SO_PEERCRED; nothing to say
                with contextlib.suppress(OSError):
                    if peer(conn)[1] == uid:
                        self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        conn.setblocking(True)
        conn.settimeout(CONNECT_S)
        request = _recv_exact(conn, REQUEST)
        if len(request) != REQUEST:
            return
        kind, digest, family = request[:1], request[1:65].decode("latin-1"), request[65:].decode("latin-1")
        with self.guard:
            entries = list(self.entries)
            entry = next((e for e in entries if e.key.digest == digest), None) if kind == b"Q" else None
            fd = os.dup(entry.fd) if entry is not None else None
        try:
            if entry is not None and fd is not None:
                if entry.stage is not None:
                    entry.stage("handing over")
                meta = _listing(entry)
                socket.send_fds(conn, [json.dumps(meta).encode()], [fd])
                return
            if kind == b"L":
                listed = [_listing(e) for e in entries]
            else:
                listed = [_listing(e) for e in entries if e.key.family == family]
            conn.sendall(json.dumps(listed).encode()[:ANSWER_LIMIT])
        finally:
            if fd is not None:
                os.close(fd)


def _listing(entry: _Entry) -> dict[str, Any]:
    return {
        "digest": entry.key.digest,
        "describe": entry.key.describe,
        "size": entry.size,
        "loaded_by": entry.loaded_by,
        "loaded_here": entry.loaded_by == os.getpid(),
    }


_ABSTRACT = AbstractPlace()
_SERVERS: dict[str, _Server] = {}
_SERVERS_GUARD = threading.Lock()


def _server(place: Place) -> _Server:
    """This process's server of copies at `place`."""
    with _SERVERS_GUARD:
        found = _SERVERS.get(place.key)
        if found is None:
            found = _SERVERS[place.key] = _Server(place)
        return found


def lock_name(digest: str) -> str:
    return f"\0engram-load-{os.geteuid()}-{digest[:48]}"


def servers(uid: int | None = None) -> list[str]:
    """The abstract names of the node's copy servers of `uid` (default ours). Owners are filtered before
    the cap, so another user's listeners under our prefix hide nothing: named by the kernel
    (abstract_names), or where it cannot name them, asked of each listener under our prefix in
    /proc/net/unix (_owned_by)."""
    wanted = os.geteuid() if uid is None else uid
    prefix = f"@engram-node-{wanted}-"
    owned = abstract_names.bound(prefix)
    if owned is not None:
        names = [b.name for b in owned if b.uid == wanted and b.listening and len(b.name) < 108]
    else:
        names = _owned_by(_listed(prefix), wanted)
    return ["\0" + name[1:] for name in dict.fromkeys(names)][:MAX_SERVERS]


LISTED_MAX = 1 << 20  # names read from /proc/net/unix at most: far more than a node's own sockets
OWNERS_S = 1.0  # the most asking listeners who they are takes (a stranger's flood), where the kernel cannot say
_unasked_said = False


def _listed(prefix: str, *, listening: bool = True) -> list[str]:
    """Names under `prefix` in /proc/net/unix (listening ones, or any bound), whoever owns them."""
    found: dict[str, None] = {}
    try:
        with open("/proc/net/unix", encoding="latin-1") as f:
            for line in f:
                fields = line.split()  # Num RefCount Protocol Flags Type St Inode Path
                accepting = len(fields) == 8 and fields[3] == "00010000"  # __SO_ACCEPTCON: not a connection
                path = fields[-1] if len(fields) == 8 and (accepting or not listening) else ""
                if path.startswith(prefix) and len(path) < 108:
                    found[path] = None
                if len(found) >= LISTED_MAX:
                    break
    except OSError:
        return []
    return list(found)


def _owned_by(names: list[str], uid: int) -> list[str]:
    """The listening names among `names` whose process runs as `uid` (SO_PEERCRED of a connection, which a
    listener gives without accepting it), asked for at most OWNERS_S; if some were left unasked (a flood
    of listeners), said once: a copy may then be loaded again rather than found."""
    global _unasked_said
    found: list[str] = []
    deadline = time.monotonic() + OWNERS_S
    for at, name in enumerate(names):
        if time.monotonic() > deadline:
            if not _unasked_said:
                _unasked_said = True
                log.warning(
                    "engram: the kernel cannot name socket owners here (no sock_diag), and %d of %d listeners named "
                    "like this user's node copy servers were not asked who they are in %g s: another user's may "
                    "hide a copy, which is then loaded again",
                    len(names) - at, len(names), OWNERS_S,
                )  # fmt: skip
            break
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            try:
                sock.connect("\0" + name[1:])  # a full queue is EAGAIN at once: ours accept as they come
                if peer(sock)[1] == uid:
                    found.append(name)
            except OSError:
                continue
        if len(found) >= MAX_SERVERS:
            break
    return found


@contextlib.contextmanager
def _connect(name: str, uid: int) -> Iterator[socket.socket | None]:
    """A connection to server `name` whose process runs as `uid`, or None."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(CONNECT_S)
        try:
            sock.connect(name)
            yield sock if peer(sock)[1] == uid else None
        except OSError:
            yield None


def ask(name: str, kind: bytes, key: ShareKey | None) -> tuple[int | None, Any, int]:
    """One server's answer: (fd, meta) for a copy of `key`, else (None, its listing of copies); then the
    server's pid as the kernel gives it to us (SO_PEERCRED: in our pid namespace, 0 where it has none)."""
    uid = os.geteuid()
    request = kind + ((key.digest + key.family).encode() if key else b"0" * 128)
    with _connect(name, uid) as sock:
        if sock is None:
            return None, [], 0
        try:
            server = peer(sock)[0]
            sock.sendall(request)
            data, fds, _, _ = socket.recv_fds(sock, ANSWER_LIMIT, 1)
            while not fds and len(data) < ANSWER_LIMIT and (more := sock.recv(ANSWER_LIMIT - len(data))):
                data += more
        except OSError:
            return None, [], 0
    try:
        answer = json.loads(data) if data else []
    except ValueError:
        answer = []
    if fds and len(fds) == 1 and isinstance(answer, dict):
        return fds[0], answer, server
    for extra in fds:
        os.close(extra)
    return None, answer if isinstance(answer, list) else [], server


def _loader(meta: dict[str, Any], server: int) -> tuple[int, str]:
    """The pid that loaded a copy as we see it, and how to say it. A server reports pids of its own pid
    namespace: its own is the kernel-translated `server`; another is meaningful here only when the server
    shares our namespace."""
    if server == 0:  # the kernel shows no pid for a process outside our pid namespace's view
        return 0, "loaded in another pid namespace"
    if meta.get("loaded_here") is True:
        return server, f"loaded by pid {server}"
    if _same_pid_namespace(server):
        loaded_by = int(meta.get("loaded_by", 0))
        return loaded_by, f"loaded by pid {loaded_by}"
    return server, f"handed on by pid {server}, loaded in another pid namespace"


def _same_pid_namespace(pid: int) -> bool:
    """Whether process `pid` (of our pid namespace) shares it, asked of a /proc that is ours."""
    try:
        return pid > 0 and proc_is_ours() and os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def listing(node_dir: str | None = None) -> list[dict[str, Any]]:
    """Every copy this user's processes on the node serve (meeting in the rendezvous directory `node_dir`,
    or in this network namespace), each with the pid of one process serving it (0: in another pid
    namespace)."""
    seen: list[dict[str, Any]] = []
    for name in place_for(node_dir).servers():
        _, copies, server = ask(name, b"L", None)
        for copy in copies:
            if isinstance(copy, dict):
                seen.append({**copy, "pid": server, "loaded_by": _loader(copy, server)[0]})
    return seen


def holders(digest: str) -> list[int]:
    """Pids of this user's processes mapping the copy `digest` (its memfd's name in /proc/PID/maps)."""
    needle = f"/{MEMFD_PREFIX}{digest[:16]}"
    uid, found = os.geteuid(), []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if os.stat(entry.path).st_uid != uid:
                continue
            with open(f"{entry.path}/maps", encoding="latin-1") as f:
                if any(needle in line for line in f):
                    found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


WRITERS_SCAN_S = 1.0  # the most one look through /proc for a file's writers takes (a node of huge maps)


def writers(files: list[Path]) -> dict[str, list[int]]:
    """Per file, the pids of the processes that map it writable and shared (/proc/PID/maps, every
    process this one may read, for at most WRITERS_SCAN_S: those it had no time for are not named).
    Their writes reach the file's pages without changing its times until written back, so no key made
    from its times can name what such a file holds."""
    wanted: dict[tuple[int, int], str] = {}
    for path in files:
        info = os.stat(path)
        wanted[(info.st_dev, info.st_ino)] = str(path)
    needles = {f" {ino} ".encode() for _, ino in wanted}
    found: dict[str, set[int]] = {}
    deadline = time.monotonic() + WRITERS_SCAN_S
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            if time.monotonic() > deadline:
                break
            for pid, name in _mapped_writable(entry, wanted, needles):
                found.setdefault(name, set()).add(pid)
    return {name: sorted(pids) for name, pids in found.items()}


def _mapped_writable(
    entry: os.DirEntry[str], wanted: dict[tuple[int, int], str], needles: set[bytes]
) -> Iterator[tuple[int, str]]:
    """(pid, file name) for each mapping in process `entry`'s maps of a `wanted` (device, inode), writable
    and shared."""
    try:
        with open(f"{entry.path}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return
    if not any(needle in maps for needle in needles):  # most processes map none of them: one search each
        return
    for line in maps.decode("latin-1").splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [path]
        if len(fields) < 5 or fields[1][1:2] != "w" or fields[1][3:4] != "s" or fields[4] == "0":
            continue
        major, _, minor = fields[3].partition(":")
        with contextlib.suppress(ValueError):
            name = wanted.get((os.makedev(int(major, 16), int(minor, 16)), int(fields[4])))
            if name is not None:
                yield int(entry.name), name


def writer_refusal(files: list[Path]) -> str | None:
    """Why no node copy of `files` can be known to hold their bytes now, or None: a process maps one
    writable and shared (named where this process can see it), or has one open for writing where it
    cannot (open_for_writing asks the kernel, whatever namespace the writer is in). Where the kernel
    cannot be asked (a file not ours, without CAP_LEASE), only the processes this one sees are looked at."""
    why = "its bytes may change without its times changing, so no node copy can be known to hold them"
    for path in files:
        fd = open_regular(path, "checkpoint file")
        try:
            writing = open_for_writing(fd)
        finally:
            os.close(fd)
        if writing is False:
            continue
        pids = writers([path]).get(str(path))
        if pids:
            shown = ", ".join(map(str, pids[:8]))
            return f"{path} is mapped writable and shared by pid {shown}: {why}; stop that writer, or set node_sharing 'off'"
        if writing:
            return (
                f"{path} is open for writing by a process this engine cannot see (in another pid namespace, a "
                f"container beside it, or one it may not read): {why}; stop that writer, or set node_sharing 'off'"
            )
    return None


def _check_received(fd: int, key: ShareKey, total: int) -> str | None:
    """Why a received fd is not the copy `key` names, or None."""
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
        info = os.fstat(fd)
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        return f"cannot inspect it: {exc.strerror}"
    if not link.startswith(f"/{MEMFD_PREFIX}") or not stat.S_ISREG(info.st_mode):
        return "it is not an engram memfd"
    if info.st_uid != os.geteuid():
        return f"it belongs to uid {info.st_uid}"
    if seals & SEALS != SEALS:
        return "it is not sealed"
    if info.st_size != total:
        return f"it holds {info.st_size:,} bytes, not {total:,}"
    trailer = os.pread(fd, len(key.digest), total - PAGE)
    return None if trailer == key.digest.encode() else "its trailer names another table"


def _attach(place: Place, key: ShareKey, size: int, label: str) -> tuple[Copy | None, list[str]]:
    """The copy of `key` from any server of ours, or None and what the servers hold of its family instead."""
    total = round_up(size, PAGE) + PAGE
    others: list[str] = []
    for name in place.servers():
        fd, answer, server = ask(name, b"Q", key)
        if fd is None:
            others += [str(c.get("describe", ""))[:300] for c in answer if isinstance(c, dict)]
            continue
        try:
            why = _check_received(fd, key, total)
            if why:
                log.warning("engram: refused a node copy offered for %s: %s", key.describe, why)
                continue
            mapping = map_sealed_file(fd, total, label)
            loaded_by, said = _loader(answer, server)
            _hold(place, fd, key, total, loaded_by, mapping, None)
            fd = None  # held now
            return Copy(mapping, loaded_by, attached=True, note=f"attached the node's copy {said}"), []
        finally:
            if fd is not None:
                os.close(fd)
    return None, sorted(set(others))


def find(key: ShareKey, size: int, node_dir: str | None = None) -> Copy | None:
    """The node's copy of `key` (`size` bytes of table) where a process of ours serves one now, else None."""
    copy, _ = _attach(place_for(node_dir), key, size, f"memfd:engram-node-{key.digest[:16]}")
    return copy


def adopt(node_dir: str) -> dict[str, Copy]:
    """Every copy served in the rendezvous directory `node_dir` now, by its key's digest, attached here and
    served from here too (a node agent that starts again takes on the copies engines still map)."""
    place, held, seen = place_for(node_dir), {}, set()
    for name in place.servers():
        _, copies, _ = ask(name, b"L", None)
        for c in copies:
            if not (isinstance(c, dict) and isinstance(c.get("digest"), str) and isinstance(c.get("size"), int)):
                continue
            if c["digest"] in seen:
                continue
            seen.add(c["digest"])
            key = ShareKey(c["digest"], "0" * 64, str(c.get("describe", ""))[:300])  # its family is not listed
            copy, _ = _attach(place, key, max(0, c["size"] - PAGE), f"memfd:engram-node-{key.digest[:16]}")
            if copy is not None:
                held[key.digest] = copy
    return held


def _hold(
    place: Place, fd: int, key: ShareKey, total: int, loaded_by: int, mapping: Mapping, stage: Stage | None
) -> None:
    """Serve the copy at `place` while `mapping` lives; its fd closes with it."""
    entry = _Entry(fd, key, total, loaded_by, stage)
    server = _server(place)
    server.publish(entry)
    mapping.on_release(lambda: server.withdraw(entry))


def _load(
    place: Place, key: ShareKey, size: int, fill: Callable[[Mapping], None], node: int | None, stage: Stage
) -> Copy:
    """A new copy: a memfd filled by `fill` (through a writable mapping dropped before it is sealed),
    sealed, mapped read-only and served."""
    total = round_up(size, PAGE) + PAGE  # the trailer page names the key
    error = capacity_error(total)
    if error:
        raise EngramError(f"{key.describe}: {error.replace('dp_shared_memory', 'node_sharing')}")
    try:
        fd = os.memfd_create(f"engram-node-{key.digest[:16]}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise EngramError(f"{key.describe}: memfd_create failed: {exc.strerror}; set node_sharing 'off'") from None
    try:
        with preferring(node):
            failed = reserve(fd, total)
        if failed:
            raise EngramError(
                f"cannot reserve {total:,} bytes for {key.describe}: {failed}; free memory or set node_sharing 'off'"
            )
        writable = map_shared_file(fd, total, f"memfd:engram-node-{key.digest[:16]}")
        fill(writable)
        trailer = torch.frombuffer(bytearray(key.digest.encode()), dtype=torch.uint8)
        writable.view(total - PAGE, (len(key.digest),), torch.uint8).copy_(trailer)
        stage("loaded")
        if not writable.release():
            gc.collect()  # a loader's view may sit in a reference cycle
            if writable.mapped:
                raise EngramError(f"internal: a view of {key.describe}'s loading mapping outlived the load")
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        stage("sealed")
        mapping = map_sealed_file(fd, total, f"memfd:engram-node-{key.digest[:16]}")
        _hold(place, fd, key, total, os.getpid(), mapping, stage)
        fd = -1  # held now
        stage("serving")
        return Copy(mapping, os.getpid(), attached=False, note="loaded here; the node's other engines attach to it")
    finally:
        if fd >= 0:
            os.close(fd)


def obtain(
    key: ShareKey,
    size: int,
    fill: Callable[[Mapping], None],
    *,
    timeout: float,
    node: int | None = None,
    stage: Stage | None = None,
    node_dir: str | None = None,
) -> Copy:
    """The node's copy of `key` (`size` bytes of table), attached if any process of ours serves one,
    else loaded here by `fill` (its pages on NUMA node `node`) while the others wait for it. Engines meet
    in the rendezvous directory `node_dir` (engram.runtime.placement.rendezvous), or in this network
    namespace."""
    place = place_for(node_dir)
    server = _server(place)
    label = f"memfd:engram-node-{key.digest[:16]}"
    tell = stage or (lambda _: None)
    deadline = time.monotonic() + timeout
    waited_on: int | None = None
    silent_since: float | None = None
    told = False
    while True:
        copy, others = _attach(place, key, size, label)
        if copy is not None:
            return copy
        if others and not told:
            log.warning(
                "engram: %s: the node's copies of this table hold %s; loading its own", key.describe, "; ".join(others)
            )
            told = True
        lock = server.lock(key.digest)
        if lock is not None:
            try:
                tell("locked")
                copy, _ = _attach(place, key, size, label)  # loaded and served while we looked
                return copy or _load(place, key, size, fill, node, tell)
            finally:
                server.unlock(key.digest)
        holder = place.holder(key.digest)
        quiet = holder is not None and holder.pid is None
        silent_since = (silent_since or time.monotonic()) if quiet else None
        squatter = place.squatter(holder, silent_since)
        if squatter:
            log.warning(
                "engram: %s holds the load lock of %s (a squatter?): loading it without the lock",
                squatter,
                key.describe,
            )
            return _load(place, key, size, fill, node, tell)
        if holder is not None and holder.pid is not None and holder.pid != waited_on:
            waited_on = holder.pid
            log.info("engram: waiting for pid %d to load %s", waited_on, key.describe)
        elif holder is not None and holder.pid is None and waited_on is None and isinstance(place, DirectoryPlace):
            waited_on = 0
            log.info("engram: waiting for another engine (in %s) to load %s", place.directory.path, key.describe)
        if time.monotonic() >= deadline:
            whom = f"pid {waited_on}" if waited_on else "another engine"
            raise EngramError(
                f"{key.describe}: waited {timeout:.0f} s for {whom} to load the node's copy; raise "
                "ENGRAM_DIST_TIMEOUT_S for tables that take longer to load, or set node_sharing 'off'"
            )
        time.sleep(POLL_S)


class Holder(NamedTuple):
    """Who holds a load lock: pid None when it answers no connect (bound without listening, `listening`
    False, or a queue it never empties: ours listen as they bind and accept at once, so only a squatter
    stays that way); uid None when the kernel cannot say."""

    pid: int | None
    uid: int | None
    listening: bool


def _lock_holder(digest: str) -> Holder | None:
    """The holder of the key's load lock, or None when it is free now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(CONNECT_S)
        try:
            sock.connect(lock_name(digest))
            pid, uid = peer(sock)
            return Holder(pid, uid, True)
        except ConnectionRefusedError:
            listening = False  # bound by no one, or without listening
        except OSError:
            listening = True  # a queue that takes no connect
    shown = "@" + lock_name(digest)[1:]
    owners = abstract_names.bound(shown)
    if owners is None:  # no owners from the kernel: /proc/net/unix still says whether the name is bound
        return Holder(None, None, listening) if listening or shown in _listed(shown, listening=False) else None
    uids = [b.uid for b in owners if b.name == shown]
    return Holder(None, uids[0], listening) if uids else None


def _squatter(holder: Holder | None, silent_since: float | None) -> str | None:
    """Who squats the load lock, in words, or None while its holder may be one of ours."""
    if holder is None:
        return None
    if holder.uid is not None:
        return f"uid {holder.uid}" if holder.uid != os.geteuid() else None
    if holder.pid is not None or silent_since is None:
        return None
    quiet = time.monotonic() - silent_since
    if not holder.listening and quiet >= UNLISTENING_S:
        return f"a process that bound it without listening for {UNLISTENING_S:g} s"
    return f"a process that has not answered for {SILENT_S:g} s" if quiet >= SILENT_S else None
