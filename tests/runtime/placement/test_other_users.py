"""A shared table beside another user's processes: a name replaced in a directory they can write gets
neither our rows nor our writes, their files and other pid namespaces' files are never reclaimed as
ours, and strangers at the hand-off socket can neither get the fd nor stall the load. Every attacker
runs as a second uid (tests/other_user.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.apps.local_ranks import run_local
from engram.runtime.placement import memfd
from engram.runtime.placement.shm import reclaim_stale, stale_files
from engram.scratch import owner_tag
from tests.other_user import OtherUser
from tests.runtime import workers

SIZE = 1 << 20
pytestmark = pytest.mark.slow

# Renames a symlink to the victim, or a file of its own, over the first engram-* name it sees.
REPLACE = """
import os, sys, time
directory, victim, kind = sys.argv[1:4]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    names = [n for n in os.listdir(directory) if n.startswith("engram-")]
    if names:
        planted = os.path.join(directory, ".planted")
        if kind == "symlink":
            os.symlink(victim, planted)
        else:
            fd = os.open(planted, os.O_CREAT | os.O_WRONLY, 0o666)
            os.ftruncate(fd, int(sys.argv[4]))
            os.close(fd)
            os.chmod(planted, 0o666)
        os.rename(planted, os.path.join(directory, names[0]))
        print(names[0])
        break
    time.sleep(0.002)
"""


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_name_replaced_by_another_user_gets_neither_rows_nor_writes(
    kind: str,
    other_user: OtherUser,
    open_directory: Callable[[int], Path],
    tmp_path: Path,
) -> None:
    shared = open_directory(0o777)  # no sticky bit: anyone may rename over anyone's name
    victim = tmp_path / "root-only"
    victim.write_bytes(os.urandom(SIZE))
    victim.chmod(0o600)
    before = victim.read_bytes()
    attacker = other_user.popen(REPLACE, str(shared), str(victim), kind, str(SIZE))
    outcomes = run_local(
        2, workers.share_and_write, SIZE, 1.0, timeout=120,
        env={"ENGRAM_SHM_DIR": str(shared), "ENGRAM_DIST_TIMEOUT_S": "30"},
    )  # fmt: skip
    replaced, _ = attacker.communicate(timeout=60)
    assert replaced.startswith("engram-race-test-"), "the attacker never saw the table's name"
    assert victim.read_bytes() == before  # the leader wrote through its own inode only
    for outcome in outcomes:
        assert outcome.error is not None and "Traceback" not in outcome.error
        assert "give ENGRAM_SHM_DIR a directory only you can write" in outcome.error
    planted = shared / replaced.strip()
    assert planted.is_symlink() if kind == "symlink" else planted.read_bytes() == bytes(SIZE)  # theirs, untouched
    assert [p.name for p in shared.iterdir()] == [planted.name]  # our own name is gone, theirs left to them


def _boot_and_namespace() -> str:
    return owner_tag().rsplit("-", 2)[0]  # <boot>-<pid namespace>


def test_another_users_stale_looking_file_is_theirs(
    other_user: OtherUser,
    open_directory: Callable[[int], Path],
) -> None:
    sticky = open_directory(0o1777)
    planted = f"engram-x-{_boot_and_namespace()}-999999999-1-0"
    other_user.run("import os, sys; open(os.path.join(sys.argv[1], sys.argv[2]), 'w').close()", str(sticky), planted)
    mine = sticky / f"engram-y-{_boot_and_namespace()}-999999999-1-0"
    mine.write_bytes(b"")
    assert stale_files(sticky) == [mine]  # a dead creator of ours; theirs is not ours to judge
    assert reclaim_stale(sticky) == [mine]
    assert [p.name for p in sticky.iterdir()] == [planted]


def test_a_job_in_another_pid_namespace_leaves_a_live_table_alone(tmp_path: Path) -> None:
    shared = tmp_path / "shm"
    shared.mkdir()
    live = shared / f"engram-layers-{owner_tag()}-{'0' * 32}"  # this live process's in-flight table
    live.write_bytes(b"rows")
    code = "import sys; from pathlib import Path; from engram.runtime.placement.shm import reclaim_stale; print(len(reclaim_stale(Path(sys.argv[1]))))"
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code, str(shared)],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[3],
    )  # fmt: skip
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot make a pid namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"  # our pid means nothing in its namespace: it does not judge it
    assert live.read_bytes() == b"rows"


# Waits for the table's abstract socket in /proc/net/unix (anyone can read it), connects `count` times
# and holds the connections silent; prints how many fds it was ever handed.
HOLD = """
import os, socket, sys, time
count = int(sys.argv[1])
deadline = time.monotonic() + 30
name = None
while name is None and time.monotonic() < deadline:
    for line in open("/proc/net/unix"):
        path = line.split()[-1]
        if path.startswith("@engram-") and len(path) == 40:
            name = "\\0" + path[1:]
    time.sleep(0.002)
held, fds = [], 0
while len(held) < count and time.monotonic() < deadline:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(name)
    except OSError:  # the queue is full: try again
        s.close()
        time.sleep(0.01)
        continue
    held.append(s)
print(len(held), flush=True)
for s in held:
    try:
        _, got, _, _ = socket.recv_fds(s, 16, 1)
        fds += len(got)
    except OSError:
        pass
print(fds)
"""


def test_strangers_at_the_hand_off_socket_get_nothing_and_stall_nothing(
    other_user: OtherUser,
) -> None:
    attacker = other_user.popen(HOLD, "8")
    # Each silent stranger used to hold the leader 5 s before the next was read: eight outlasted this
    # 20 s timeout and failed the load, and the backlog they filled refused the real peer at once.
    outcomes = run_local(2, workers.share_with_a_late_peer, SIZE, 1.5, timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "20"})
    out, err = attacker.communicate(timeout=90)
    assert [o.error for o in outcomes] == [None, None]
    assert [o.value for o in outcomes] == [SIZE, SIZE]
    connected, handed = (int(n) for n in out.split()) if len(out.split()) == 2 else (0, err)
    assert connected >= 1, err  # it did reach the socket
    assert handed == 0


def test_a_failing_peer_is_known_to_its_leader_at_the_fence() -> None:
    # The group's timeout is longer than the test's: a leader still waiting at its socket for the peer
    # would be killed as timed out instead of reporting the peer's error.
    outcomes = run_local(2, workers.share_with_a_failing_peer, SIZE, timeout=60, env={"ENGRAM_DIST_TIMEOUT_S": "600"})
    for outcome in outcomes:
        assert outcome.error is not None and "rank 1: rank 1 could not take the fd (test)" in outcome.error


def test_silent_connections_of_our_own_uid_delay_no_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memfd, "PROOF_S", 0.5)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"\0engram-test-{os.getpid()}-{time.monotonic_ns()}"
    listener.bind(name)
    listener.listen(memfd.BACKLOG)
    table = os.memfd_create("t")
    stop = threading.Event()
    server = threading.Thread(target=memfd._serve, args=(listener, table, b"t" * 64, os.getuid(), 1, stop))
    server.start()
    silent = []
    for _ in range(memfd.PENDING_MAX + 10):  # more than may wait: the surplus is turned away, not queued
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(name)
        silent.append(s)
    # The real peer comes last, behind every silent one: turned away while they fill the pending set, it
    # tries again and is served once their grace runs out; the server thread exits once it has served it.
    fd, error = memfd._receive(name, b"t" * 64, time.monotonic() + 30)
    server.join(timeout=30)
    stop.set()
    try:
        assert error is None and fd is not None
        assert os.fstat(fd).st_ino == os.fstat(table).st_ino
        assert not server.is_alive()
    finally:
        for s in silent:
            s.close()
        listener.close()
        os.close(table)
        if fd is not None:
            os.close(fd)


# A leader's table as its leader names it (shm.create_named), made by a process that lives until stdin closes.
LEADER = """
import sys
from pathlib import Path
from engram.scratch import owner_tag
path = Path(sys.argv[1]) / f"engram-layers-{owner_tag()}-{'0' * 32}"
path.write_bytes(b"rows")
print(path.name, flush=True)
sys.stdin.read()
"""


def test_doctor_clean_leaves_a_live_leaders_table_made_in_another_time_namespace(tmp_path: Path) -> None:
    """/proc shows a start time shifted by the reader's time namespace: a leader in one (its boot time
    moved by 100,000 s) is still alive to `engram doctor --clean` outside it, and gone once it exits."""
    root = Path(__file__).parents[3]
    leader = subprocess.Popen(
        ["unshare", "--time", "--boottime", "100000", sys.executable, "-c", LEADER, str(tmp_path)], cwd=root,
        text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    with leader:
        assert leader.stdout is not None and leader.stdin is not None
        name = leader.stdout.readline().strip()
        if not name:
            pytest.skip(f"cannot make a time namespace here: {leader.communicate(timeout=60)[1].strip()}")
        doctor = [sys.executable, "-m", "engram", "doctor", "--clean"]
        env = {**os.environ, "ENGRAM_SHM_DIR": str(tmp_path)}
        done = subprocess.run(doctor, cwd=root, env=env, capture_output=True, text=True, timeout=120)
        assert (tmp_path / name).read_bytes() == b"rows", done.stdout
        leader.stdin.close()
        assert leader.wait(timeout=60) == 0
    done = subprocess.run(doctor, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert list(tmp_path.iterdir()) == [], done.stdout
