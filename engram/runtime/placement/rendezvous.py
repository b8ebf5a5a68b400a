"""A rendezvous directory for node copies (node_dir, ENGRAM_NODE_DIR): engines that see one directory, a
hostPath every pod mounts, meet there whatever their network, pid, mount and IPC namespaces, on Unix
sockets bound in it (a memfd passes over SCM_RIGHTS between network namespaces) instead of the network
namespace's abstract names (engram.runtime.placement.node_sharing has the protocol over either).

The directory is hostile ground until checked. It is opened once, without following a link at its name,
and must be a directory of this effective uid that no other user can write (created so when missing);
every name in it is then reached through that descriptor (/proc/self/fd/N/NAME, which the kernel
resolves to the directory opened, whatever its path names later), and only sockets and lock files of
this uid are used. What a process leaves there when killed holds nothing (the copies are memfds): a
socket no process listens on, a load lock no process holds, or a socket bound but not yet named; the
next engine to look removes them.

Across user namespaces the kernel translates a peer's uid (SO_PEERCRED) and a file's owner into ours: two
engines agree only when they run as the same uid of the host. An engine whose own uid is the overflow uid
(an unmapped one) cannot tell another user namespace's unmapped users from itself, and is refused."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import socket
import stat
import struct
import time
from pathlib import Path

from engram.errors import EngramError

SERVER_PREFIX = "s-"  # a listening copy server
AGENT_PREFIX = "a-"  # a listening node agent (engram.runtime.placement.node_agent)
AGENT_MARK = "agent"  # made by a node agent's first start: engines here wait for it while it restarts
BINDING_PREFIX = "t-"  # a server socket bound, not yet listening: renamed to s- once it listens
LOCK_PREFIX = "l-"  # a key's load lock, held by an open file description's lock
MAX_ENTRIES = 4096  # names looked at per listing: one per engine process of this user and key, far fewer
LIST_S = 1.0  # the most one listing takes (a directory flooded by our own uid's processes)
BINDING_STALE_S = 30.0  # a socket bound this long and still not listening was left by a killed process
F_OFD_GETLK, F_OFD_SETLK = getattr(fcntl, "F_OFD_GETLK", 36), getattr(fcntl, "F_OFD_SETLK", 37)
FLOCK = struct.Struct("hhqqi4x")  # struct flock: l_type, l_whence, l_start, l_len, l_pid


def overflow_uid() -> int:
    """The uid the kernel shows for a uid unmapped in this user namespace."""
    try:
        return int(Path("/proc/sys/kernel/overflowuid").read_text())
    except (OSError, ValueError):
        return 65534


def _fix(path: str) -> str:
    uid = os.geteuid()
    return f"make it a directory of uid {uid} that only it can write (chown {uid} {path} && chmod 0700 {path}), or name one that is"


class Rendezvous:
    """The rendezvous directory at `path`, opened and checked (module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        uid = os.geteuid()
        if uid == overflow_uid():
            raise EngramError(
                f"node_dir {path}: this engine runs as the overflow uid {uid} (unmapped in its user namespace), "
                "which cannot be told from another namespace's unmapped users; run it as a mapped uid, or unset node_dir"
            )
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise EngramError(f"node_dir {path}: cannot create it ({exc.strerror}); {_fix(path)}") from None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
                raise EngramError(
                    f"node_dir {path} is a link, which is never followed: name the directory itself"
                ) from None
            raise EngramError(f"node_dir {path}: cannot open it ({exc.strerror}); {_fix(path)}") from None
        try:
            info = os.fstat(fd)
            if info.st_uid != uid:
                raise EngramError(
                    f"node_dir {path} belongs to uid {info.st_uid}, not this engine's {uid}; {_fix(path)}"
                )
            if info.st_mode & 0o022:
                raise EngramError(
                    f"node_dir {path} can be written by other users (mode {stat.S_IMODE(info.st_mode):04o}); {_fix(path)}"
                )
            try:
                seen = os.stat(f"/proc/self/fd/{fd}")
            except OSError:
                seen = None
            if seen is None or (seen.st_dev, seen.st_ino) != (info.st_dev, info.st_ino):
                raise EngramError(
                    f"node_dir {path}: /proc/self does not show this process's descriptors (mount a /proc of its "
                    "pid namespace), so names in the directory cannot be reached through it; unset node_dir"
                )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._named: dict[int, tuple[str, int]] = {}  # a listening socket's fd -> its name here, the pid that named it

    def digests(self) -> Path:
        """The directory in it where checkpoint rows' digests are kept (engram.runtime.checkpoints.content),
        reached through the descriptor; user_cache's checks apply to what is read there."""
        with contextlib.suppress(FileExistsError):
            os.mkdir("digests", 0o700, dir_fd=self.fd)
        return Path(self.address("digests"))

    def address(self, name: str) -> str:
        """Where `name` in the directory is bound or connected to, through the open descriptor."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def listen(self, prefix: str = SERVER_PREFIX) -> socket.socket:
        """A copy server's listening socket (or with AGENT_PREFIX a node agent's), named in the directory
        only once it listens (so a name no one listens on is a dead process's)."""
        token = f"{os.geteuid()}-{secrets.token_hex(12)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.address(BINDING_PREFIX + token))
            os.chmod(BINDING_PREFIX + token, 0o600, dir_fd=self.fd)  # ours alone: it was made in our directory
            sock.listen(64)
            os.rename(BINDING_PREFIX + token, prefix + token, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            sock.close()
            with contextlib.suppress(OSError):
                os.unlink(BINDING_PREFIX + token, dir_fd=self.fd)
            raise EngramError(f"node_dir {self.path}: cannot serve node copies there: {exc.strerror}") from None
        sock.setblocking(False)
        self._named[sock.fileno()] = (prefix + token, os.getpid())
        return sock

    def close(self, sock: socket.socket) -> None:
        """Stop serving: the socket's name goes (where this process named it: a forked child's copy of the
        socket leaves its parent's name alone), then the socket."""
        name, pid = self._named.pop(sock.fileno(), ("", 0))
        if name and pid == os.getpid():
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self.fd)
        sock.close()

    def _entries(self) -> list[tuple[str, os.stat_result]]:
        """This uid's entries, each as lstat sees it, for at most LIST_S and MAX_ENTRIES names."""
        uid, found = os.geteuid(), []
        deadline = time.monotonic() + LIST_S
        with os.scandir(self.fd) as entries:
            for at, entry in enumerate(entries):
                if at >= MAX_ENTRIES or time.monotonic() > deadline:
                    break
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if info.st_uid == uid:
                        found.append((entry.name, info))
        return found

    def servers(self, prefix: str = SERVER_PREFIX) -> list[str]:
        """The addresses of the copy servers (or with AGENT_PREFIX the node agents) listening here now. Names
        left by dead processes (a socket no one listens on, one bound long ago and never listening, a lock
        no one holds) are removed on the way."""
        found = []
        for name, info in self._entries():
            if stat.S_ISSOCK(info.st_mode) and name.startswith(prefix):
                if self._listening(name):
                    found.append(self.address(name))
            elif stat.S_ISSOCK(info.st_mode) and name.startswith(BINDING_PREFIX):
                if time.time() - info.st_mtime > BINDING_STALE_S:
                    self._remove(name, info)
            elif stat.S_ISREG(info.st_mode) and name.startswith(LOCK_PREFIX):
                self._sweep_lock(name)
        return found

    def mark_agent(self) -> None:
        """Say that a node agent serves this directory (kept across its restarts; remove the file `agent` to
        retire it)."""
        fd = os.open(AGENT_MARK, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        os.close(fd)

    def agent_expected(self) -> bool:
        """Whether a node agent serves this directory (running now, or restarting)."""
        try:
            info = os.stat(AGENT_MARK, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()

    def survey(self) -> dict[str, int]:
        """What the directory holds now (a dead process's names removed first): copy servers listening, load
        locks held (loads under way), rows' digests kept."""
        servers = len(self.servers())
        locks = sum(
            1
            for name, info in self._entries()
            if stat.S_ISREG(info.st_mode) and name.startswith(LOCK_PREFIX) and self.locked(name[len(LOCK_PREFIX) :])
        )
        try:
            digests = len(os.listdir(self.digests()))
        except OSError:
            digests = 0
        return {"servers": servers, "locks": locks, "digests": digests}

    def _listening(self, name: str) -> bool:
        """Whether a process listens on `name`; a name no one listens on is removed."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK) as sock:
            try:
                sock.connect(self.address(name))
                return True
            except ConnectionRefusedError:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self.fd)
                return False
            except BlockingIOError:
                return True  # a full queue: alive, and busy
            except OSError:
                return False

    def _remove(self, name: str, info: os.stat_result) -> None:
        with contextlib.suppress(OSError):
            now = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                os.unlink(name, dir_fd=self.fd)

    def lock(self, digest: str) -> int | None:
        """Take the load lock of the key `digest`: an fd holding an open file description lock on the lock
        file (the kernel drops it with the last descriptor, so a killed holder holds nothing), or None while
        another process holds it."""
        name = LOCK_PREFIX + digest[:48]
        for _ in range(16):  # the name may be removed between our open and our lock: then again
            fd = self._open_lock(name, create=True)
            if fd is None:
                return None
            try:
                fcntl.fcntl(fd, F_OFD_SETLK, FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    return None
                raise EngramError(f"node_dir {self.path}: cannot take a load lock: {exc.strerror}") from None
            if self._still_named(name, fd):
                return fd
            os.close(fd)
        return None

    def unlock(self, digest: str, fd: int) -> None:
        """Give the load lock up: its name goes while it is held (no one takes a lock on a name that goes)."""
        with contextlib.suppress(OSError):
            if self._still_named(LOCK_PREFIX + digest[:48], fd):
                os.unlink(LOCK_PREFIX + digest[:48], dir_fd=self.fd)
        os.close(fd)

    def locked(self, digest: str) -> bool:
        """Whether a process holds the key's load lock now."""
        fd = self._open_lock(LOCK_PREFIX + digest[:48], create=False)
        if fd is None:
            return False
        try:
            probe = fcntl.fcntl(fd, F_OFD_GETLK, FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            return bool(FLOCK.unpack(probe)[0] != fcntl.F_UNLCK)
        except OSError:
            return False
        finally:
            os.close(fd)

    def _sweep_lock(self, name: str) -> None:
        """Remove a lock file no process holds (its holder was killed before it could remove it)."""
        fd = self._open_lock(name, create=False)
        if fd is None:
            return
        try:
            fcntl.fcntl(fd, F_OFD_SETLK, FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            if self._still_named(name, fd):
                os.unlink(name, dir_fd=self.fd)
        except OSError:
            pass  # held: a loader at work
        finally:
            os.close(fd)

    def _open_lock(self, name: str, *, create: bool) -> int | None:
        """The lock file `name`, a regular file of ours (never a link), or None where it is not."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | (os.O_CREAT if create else 0)
        try:
            fd = os.open(name, flags, 0o600, dir_fd=self.fd)
        except OSError:
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            os.close(fd)
            return None
        return fd

    def _still_named(self, name: str, fd: int) -> bool:
        """Whether `name` still names the file open at `fd`."""
        try:
            now, held = os.stat(name, dir_fd=self.fd, follow_symlinks=False), os.fstat(fd)
        except OSError:
            return False
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


_OPEN: dict[str, Rendezvous] = {}


def rendezvous(path: str) -> Rendezvous:
    """The rendezvous directory at `path`, opened once per process."""
    found = _OPEN.get(path)
    if found is None:
        found = _OPEN[path] = Rendezvous(path)
    return found
