"""node_sharing: independent engine processes of one user map one sealed copy of each table shard; a
kill at any instant leaves nothing behind and no survivor sees a partial table; another user can neither
attach nor stop us from loading."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from engram.errors import EngramError
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.node_copy import node_shard, share_key
from engram.runtime.shard import ShardFormat
from tests.other_user import OtherUser
from tests.runtime import node_engine
from tests.runtime.specs import SMALL

WAIT_S = 120.0


def expected_digests(checkpoint: Path, rows: int | None = None) -> dict[str, str]:
    """Each table's weight and scale bytes (its rows [0, rows) where given) as safetensors' own reader gives
    them (the independent oracle)."""
    import hashlib

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        tensors.update(safetensors.torch.load_file(file))
    out = {}
    for name in SMALL.table_names():
        weight, scale = (tensors[f"{name}.{part}"][:rows].contiguous() for part in ("weight", "scale"))
        digest = hashlib.sha256(weight.view(torch.uint8).numpy().tobytes())
        digest.update(scale.view(torch.uint8).numpy().tobytes())
        out[name] = digest.hexdigest()
    return out


# Engines fork from a server that imported torch and engram once: each is a process of its own, with no
# tie to the others (no torch.distributed group), and starts in milliseconds instead of seconds.
FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tests.runtime.node_engine"])


class Engine:
    """One tests.runtime.node_engine process."""

    def __init__(
        self,
        checkpoint: Path,
        report: Path,
        *,
        stage: str | None = None,
        rows: int | None = None,
        sandboxed: bool = False,
    ) -> None:
        self.report = report
        args = (str(checkpoint), report, "node", stage, rows, sandboxed)
        self.proc = FORKS.Process(target=node_engine.run, args=args)
        self.proc.start()

    @property
    def pid(self) -> int:
        assert self.proc.pid is not None
        return self.proc.pid

    def failure(self) -> str:
        error = self.report.with_suffix(".error")
        return error.read_text()[-3000:] if error.exists() else f"exit code {self.proc.exitcode}"

    def wait_file(self, suffix: str) -> dict[str, Any]:
        path = self.report.with_suffix(suffix)
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            assert self.proc.is_alive(), f"the engine died: {self.failure()}"
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.01)
        time.sleep(0.01)  # written whole: JSON of a few hundred bytes
        return json.loads(path.read_text())

    def ready(self) -> dict[str, Any]:
        return self.wait_file(".ready")

    def pss(self) -> int:
        self.report.with_suffix(".go").touch()
        return int(self.wait_file(".pss")["pss"])

    def log(self) -> str:
        path = self.report.with_suffix(".log")
        return path.read_text() if path.exists() else ""

    def wait_log(self, text: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while text not in self.log():
            assert self.proc.is_alive() and time.monotonic() < deadline, (text, self.log(), self.failure())
            time.sleep(0.01)

    def finish(self) -> str:
        """Let it measure and exit; what it logged."""
        self.report.with_suffix(".go").touch()
        self.report.with_suffix(".exit").touch()
        self.proc.join(WAIT_S)
        assert self.proc.exitcode == 0, self.failure()
        return self.log()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(WAIT_S)
        assert self.proc.exitcode == -signal.SIGKILL


def leftovers() -> dict[str, list[str]]:
    """What node sharing could leave behind: memfds in any process, abstract sockets, /dev/shm files."""
    memfds = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if "memfd:engram-node-" in link:
                    memfds.append(f"{pid}: {link}")
        except OSError:
            continue
    names = [line.split()[-1] for line in Path("/proc/net/unix").read_text().splitlines()[1:] if len(line.split()) == 8]
    sockets = sorted({n for n in names if n.startswith(("@engram-node-", "@engram-load-"))})
    shm = sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith("engram-node"))
    return {"memfds": memfds, "sockets": sockets, "shm": shm}


NOTHING: dict[str, list[str]] = {"memfds": [], "sockets": [], "shm": []}


def settled() -> dict[str, list[str]]:
    """leftovers() once the kernel has reaped what the killed processes held (at most a few seconds)."""
    deadline = time.monotonic() + 10
    while (found := leftovers()) != NOTHING and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def table_bytes() -> int:
    return sum(ShardFormat(rows, SMALL.head_dim, SMALL.dtype).nbytes for rows in SMALL.layout.table_rows)


@pytest.mark.slow
def test_four_independent_engines_map_one_copy(checkpoint: Path, tmp_path: Path) -> None:
    engines = [Engine(checkpoint, tmp_path / f"engine{i}") for i in range(4)]
    reports = [e.ready() for e in engines]
    pss = [e.pss() for e in engines]  # every engine alive and holding its tables while all measure
    for e in engines:
        e.finish()
    for table in SMALL.table_names():  # one engine loaded each table; the three others attached its copy
        loader = {r["origins"][table][1] for r in reports}
        assert len(loader) == 1
        origins = sorted(r["origins"][table][0] if r["pid"] != r["origins"][table][1] else "self" for r in reports)
        assert origins == ["attached", "attached", "attached", "self"]
        assert [r["origins"][table][0] for r in reports if r["pid"] in loader] == ["loaded"]
    oracle = expected_digests(checkpoint)
    assert all(r["digests"] == oracle for r in reports)
    assert sum(pss) <= 1.05 * table_bytes(), (pss, table_bytes())


# Where a loading engine is killed: inside the copy's bytes, after the lock, once loaded (not sealed),
# once sealed (not served), once serving, and while handing the copy to another engine.
LOADER_STAGES = ["filling", "locked", "loaded", "sealed"]


@pytest.mark.slow
@pytest.mark.parametrize("stage", LOADER_STAGES)
def test_a_loader_killed_at_any_stage_leaves_nothing_and_the_waiter_loads(
    stage: str, checkpoint: Path, tmp_path: Path
) -> None:
    loader = Engine(checkpoint, tmp_path / "loader", stage=stage)
    assert loader.wait_file(".stage")["stage"] == stage
    waiter = Engine(checkpoint, tmp_path / "waiter")
    waiter.wait_log(f"waiting for pid {loader.pid} to load")  # it found the lock taken
    loader.kill()
    report = waiter.ready()
    assert report["digests"] == expected_digests(checkpoint)
    assert all(origin == ["loaded", report["pid"]] for origin in report["origins"].values())
    waiter.finish()


@pytest.mark.slow
def test_a_holder_killed_while_handing_over_leaves_the_attacher_a_whole_table(checkpoint: Path, tmp_path: Path) -> None:
    holder = Engine(checkpoint, tmp_path / "holder", stage="handing over")
    holder.ready()
    attacher = Engine(checkpoint, tmp_path / "attacher")
    assert holder.wait_file(".stage")["stage"] == "handing over"
    holder.kill()
    report = attacher.ready()
    assert report["digests"] == expected_digests(checkpoint)
    # whatever it got before the kill is whole; afterwards it found no copy and loaded its own
    assert all(origin[0] in ("loaded", "attached") for origin in report["origins"].values())
    attacher.finish()


@pytest.mark.slow
def test_every_holder_killed_at_once_leaves_nothing(checkpoint: Path, tmp_path: Path) -> None:
    engines = [Engine(checkpoint, tmp_path / f"engine{i}") for i in range(3)]
    for e in engines:
        e.ready()
    assert leftovers()["memfds"]  # the copies are there while they run
    for e in engines:
        os.kill(e.pid, signal.SIGKILL)
    for e in engines:
        e.proc.join(WAIT_S)
        assert e.proc.exitcode == -signal.SIGKILL
    # the fixture checks that nothing is left


@pytest.mark.slow
def test_a_survivor_keeps_the_copy_after_its_loader_dies(checkpoint: Path, tmp_path: Path) -> None:
    first, second = Engine(checkpoint, tmp_path / "first"), None
    loaded = first.ready()
    second = Engine(checkpoint, tmp_path / "second")
    attached = second.ready()
    assert all(o == ["attached", loaded["pid"]] for o in attached["origins"].values())
    first.kill()
    third = Engine(checkpoint, tmp_path / "third")  # the survivor hands the copy on: no owner to lose
    late = third.ready()
    assert all(o == ["attached", loaded["pid"]] for o in late["origins"].values())
    assert late["digests"] == attached["digests"] == expected_digests(checkpoint)
    second.finish()
    third.finish()


@pytest.mark.slow
def test_an_engine_of_other_rows_loads_its_own_and_says_why(checkpoint: Path, tmp_path: Path) -> None:
    whole = Engine(checkpoint, tmp_path / "whole")
    whole.ready()
    part = Engine(checkpoint, tmp_path / "part", rows=1000)
    report = part.ready()
    assert all(o == ["loaded", report["pid"]] for o in report["origins"].values())
    err = part.finish()
    whole.finish()
    for name, rows in zip(SMALL.table_names(), SMALL.layout.table_rows, strict=True):
        assert (
            f"rows [0, 1,000) of {rows:,} of {name} as fp8 x 128 (one copy for the node): the node's copies of "
            f"this table hold rows [0, {rows:,}) of {rows:,} of {name} as fp8 x 128 (one copy for the node); "
            "loading its own"
        ) in err


STRANGER = r"""
import json, os, socket, sys
uid = int(sys.argv[1])
names = set()
for line in open("/proc/net/unix"):
    fields = line.split()
    if len(fields) == 8 and fields[7].startswith(("@engram-node-%d-" % uid, "@engram-load-%d-" % uid)):
        names.add(fields[7])
got = []
for name in sorted(names):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect("\0" + name[1:])
        for kind in (b"Q", b"L"):
            s.sendall(kind + b"0" * 128)
        data, fds, _, _ = socket.recv_fds(s, 65536, 4)
        got.append([name, len(data), len(fds)])
    except OSError as exc:
        got.append([name, "refused: %s" % exc.__class__.__name__, 0])
print(json.dumps(got))
"""


@pytest.mark.slow
def test_another_user_can_neither_attach_nor_list(checkpoint: Path, tmp_path: Path, other_user: OtherUser) -> None:
    engine = Engine(checkpoint, tmp_path / "engine")
    engine.ready()
    tried = json.loads(other_user.run(STRANGER, str(os.geteuid())))
    engine.finish()
    assert tried and all(name.startswith("@engram-node-0-") for name, _, _ in tried)
    assert all(
        received in (0, "refused: ConnectionResetError", "refused: BrokenPipeError") and fds == 0
        for _, received, fds in tried
    )


# Binds our load lock's name and a copy server's name as another uid, in one of three ways: "listen" (it
# answers, and offers a forged memfd), "bound" (no listen: a connect is refused) or "full" (a listen queue
# it never empties: a connect times out).
SQUATTER = r"""
import os, socket, sys, time
lock, server, mode = sys.argv[1], sys.argv[2], sys.argv[3]
held = []
for name in (lock, server):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0" + name)
    if mode != "bound":
        s.listen(0 if mode == "full" else 16)
    held.append(s)
if mode == "full":
    for _ in range(4):
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.setblocking(False)
        try:
            c.connect("\0" + lock)
        except OSError:
            pass
        held.append(c)
fd = os.memfd_create("engram-node-squat", os.MFD_ALLOW_SEALING)
os.ftruncate(fd, 1 << 20)
print("ready", flush=True)
deadline = time.monotonic() + 60
held[1].settimeout(0.2)
while time.monotonic() < deadline:
    if mode != "listen":
        time.sleep(0.2)
        continue
    try:
        conn, _ = held[1].accept()
    except OSError:
        continue
    try:
        socket.send_fds(conn, [b'{"loaded_by": 1, "size": 1, "describe": "x"}'], [fd])
    except OSError:
        pass
    conn.close()
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "sandboxed", "squatter"),
    [
        ("listen", False, "uid {uid}"),
        ("bound", False, "uid {uid}"),
        ("full", False, "uid {uid}"),
        ("listen", True, "uid {uid}"),  # SO_PEERCRED names a listener without sock_diag
        ("bound", True, "a process that bound it without listening for 0.25 s"),
        ("full", True, "a process that has not answered for 2 s"),
    ],
)
def test_a_squatting_user_cannot_block_the_load_or_feed_rows(
    checkpoint: Path, tmp_path: Path, other_user: OtherUser, mode: str, sandboxed: bool, squatter: str
) -> None:
    """Another uid binds the load lock first (listening, bound alone, or with a full queue): the engine
    loads without it, naming who holds it, the kernel's sock_diag or not."""
    table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
    key = share_key(Checkpoint(checkpoint), table, rows, 0, ShardFormat(rows, SMALL.head_dim, SMALL.dtype), None)
    uid = os.geteuid()
    lock, server = f"engram-load-{uid}-{key.digest[:48]}", f"engram-node-{uid}-{'f' * 24}"
    with other_user.popen(SQUATTER, lock, server, mode) as squat:
        assert squat.stdout is not None and squat.stdout.readline().strip() == "ready"
        engine = Engine(checkpoint, tmp_path / "engine", sandboxed=sandboxed)
        report = engine.ready()
        err = engine.finish()
        squat.kill()
        squat.communicate(timeout=WAIT_S)
    assert report["digests"] == expected_digests(checkpoint)
    assert all(o == ["loaded", report["pid"]] for o in report["origins"].values())
    said = squatter.format(uid=other_user.uid)
    assert f"{said} holds the load lock of rows [0, {rows:,}) of {rows:,} of {table}" in err


# Listens on `count` names under our copy servers' prefix, as another uid, and says so.
FLOOD = r"""
import secrets, socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind("\0engram-node-%s-%s" % (sys.argv[1], secrets.token_hex(12)))
    s.listen(1)
    held.append(s)
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("sandboxed", [False, True], ids=["sock_diag", "no sock_diag"])
def test_another_users_listeners_hide_no_copy(
    checkpoint: Path, tmp_path: Path, other_user: OtherUser, sandboxed: bool
) -> None:
    """Another uid listens on 2,000 names under our copy servers' prefix, far more than the servers an
    engine tries: the next engine still finds the first one's copy, whether the kernel names socket
    owners (sock_diag) or each listener is asked who it is (a sandbox without netlink)."""
    first = Engine(checkpoint, tmp_path / "first")
    loaded = first.ready()
    with other_user.popen(FLOOD, str(os.geteuid()), "2000") as flood:
        assert flood.stdout is not None and flood.stdout.readline().strip() == "ready"
        second = Engine(checkpoint, tmp_path / "second", sandboxed=sandboxed)
        report = second.ready()
        second.finish()
        flood.kill()
        flood.communicate(timeout=WAIT_S)
    first.finish()
    assert report["origins"] == {name: ["attached", loaded["pid"]] for name in loaded["origins"]}
    assert report["digests"] == expected_digests(checkpoint)


@pytest.mark.slow
def test_a_copy_loaded_in_another_pid_namespace_names_its_loader_by_our_pid(checkpoint: Path, tmp_path: Path) -> None:
    report = tmp_path / "inner"
    code = "import sys; from pathlib import Path; from tests.runtime import node_engine; node_engine.run(sys.argv[1], Path(sys.argv[2]))"
    inner = subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code, str(checkpoint), str(report)],
        cwd=Path(__file__).parents[3], stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + WAIT_S
        while not report.with_suffix(".ready").exists():
            if inner.poll() is not None:
                pytest.skip(f"cannot make a pid namespace here: {inner.stderr.read() if inner.stderr else ''}")
            assert time.monotonic() < deadline, "the engine in its own pid namespace never became ready"
            time.sleep(0.05)
        time.sleep(0.01)
        [ours] = Path(f"/proc/{inner.pid}/task/{inner.pid}/children").read_text().split()  # unshare's child
        assert json.loads(report.with_suffix(".ready").read_text())["pid"] != int(ours)  # its own namespace's pid
        engine = Engine(checkpoint, tmp_path / "outer")
        told = engine.ready()
        engine.finish()
    finally:
        report.with_suffix(".go").touch()
        report.with_suffix(".exit").touch()
        inner.wait(WAIT_S)
        if inner.stderr is not None:
            inner.stderr.close()
    assert told["origins"] == {name: ["attached", int(ours)] for name in told["origins"]}


def test_an_unsealed_copy_of_our_own_uid_is_refused(checkpoint: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A server of our uid offering a memfd that is not sealed (its rows could change under us): refused,
    and the table loaded here instead."""
    import gc
    import socket
    import threading

    from engram.memory.mapping import PAGE, round_up
    from engram.runtime.rank_tables import open_tables

    table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
    fmt = ShardFormat(rows, SMALL.head_dim, SMALL.dtype)
    key = share_key(Checkpoint(checkpoint), table, rows, 0, fmt, None)
    total = round_up(fmt.nbytes, PAGE) + PAGE
    fd = os.memfd_create(f"engram-node-{key.digest[:16]}", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, total)
    os.pwrite(fd, key.digest.encode(), total - PAGE)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(f"\0engram-node-{os.geteuid()}-{'e' * 24}")
    listener.listen(8)
    listener.settimeout(0.1)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.recv(129)
                socket.send_fds(conn, [b'{"loaded_by": 1}'], [fd])

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        shards = open_tables(SMALL, Checkpoint(checkpoint), "node", progress=False)
        assert [(s.attached, s.loaded_by) for s in shards] == [(False, os.getpid())] * len(shards)
        assert f"refused a node copy offered for {key.describe}: it is not sealed" in caplog.text
    finally:
        done.set()
        server.join(5)
        listener.close()
        os.close(fd)
    for shard in shards:
        assert shard.release()
    del shards
    gc.collect()


def test_doctor_lists_the_copies_held_and_who_maps_them(
    checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engram.cli import main

    first = Engine(checkpoint, tmp_path / "first")
    loader = first.ready()["pid"]
    second = Engine(checkpoint, tmp_path / "second")
    second.ready()
    assert main(["doctor", "--json"]) == 0
    [check] = [c for c in json.loads(capsys.readouterr().out) if c["name"] == "node copies"]
    first.finish()
    second.finish()
    assert check["status"] == "pass" and check["detail"].startswith("2 held now: ")
    for name, rows in zip(SMALL.table_names(), SMALL.layout.table_rows, strict=True):
        copy = f"rows [0, {rows:,}) of {rows:,} of {name} as fp8 x 128 (one copy for the node)"
        assert copy in check["detail"]
        holders = ", ".join(map(str, sorted((first.pid, second.pid))))
        cgroup = memory_cgroup(os.getpid())  # the engines' (forked from ours)
        assert f"{copy}, 6.6 MiB, loaded by pid {loader} (cgroup {cgroup}), mapped by pids {holders}" in check["detail"]


def memory_cgroup(pid: int | str) -> str:
    """The cgroup whose memory a process's pages are charged to: cgroup v1's memory controller line, else
    v2's one line."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    return next((path for _, controllers, path in lines if "memory" in controllers.split(",")), lines[-1][2])


# Maps the file writable and shared, as an in-place updater would, says so and waits to be killed.
WRITER = r"""
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
mapped = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
print("mapped", flush=True)
time.sleep(120)
"""


def test_a_checkpoint_mapped_writable_elsewhere_is_never_shared(checkpoint: Path, tmp_path: Path) -> None:
    """A process that maps the checkpoint writable and shared can change its bytes without changing its
    times (a write to a page already dirty), so no key names what it holds: neither loaded for the node
    nor attached while it maps it, with an error naming it; once it is gone, the copy loads."""
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
    fmt = ShardFormat(rows, SMALL.head_dim, SMALL.dtype)
    opened = Checkpoint(copy)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(copy / "model.safetensors")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "mapped"
        with pytest.raises(EngramError) as refused:
            node_shard(table, fmt, 0, rows, opened, mode="node", device=torch.device("cpu"), progress=False)
    finally:
        writer.kill()
        writer.communicate(timeout=WAIT_S)
    assert str(refused.value) == (
        f"{copy / 'model.safetensors'} is mapped writable and shared by pid {writer.pid}: its bytes may change "
        "without its times changing, so no node copy can be known to hold them; stop that writer, or set "
        "node_sharing 'off'"
    )
    shard = node_shard(table, fmt, 0, rows, opened, mode="node", device=torch.device("cpu"), progress=False)
    assert shard.loaded_by == os.getpid() and not shard.attached
    assert shard.release()


# Maps argv[1] writable and shared and says so; then for each line on stdin writes byte (the line's
# number + 1) over bytes [argv[2], argv[3]) through the mapping and says "done"; ends when stdin closes.
REWRITER = r"""
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
mapped = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
os.close(fd)
start, stop = int(sys.argv[2]), int(sys.argv[3])
print("mapped", flush=True)
for number, _ in enumerate(sys.stdin, 1):
    mapped[start:stop] = bytes([number]) * (stop - start)
    print("done", flush=True)
"""
ENGINE_IN_ITS_PID_NAMESPACE = r"""
import sys, torch
from engram.errors import EngramError
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.node_copy import node_shard
from engram.runtime.shard import ShardFormat
from tests.runtime.specs import SMALL
table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
try:
    node_shard(table, ShardFormat(rows, SMALL.head_dim, SMALL.dtype), 0, rows, Checkpoint(sys.argv[1]), mode="node",
               device=torch.device("cpu"), progress=False)
    print("loaded")
except EngramError as exc:
    print(exc)
"""


def weight_bytes(path: Path) -> tuple[int, int]:
    """[start, stop) of table 0's weight rows in the safetensors file `path` (its header says where)."""
    header = json.loads(path.read_bytes()[8 : 8 + int.from_bytes(path.read_bytes()[:8], "little")])
    begin, end = header[f"{SMALL.table_names()[0]}.weight"]["data_offsets"]
    data = 8 + int.from_bytes(path.read_bytes()[:8], "little")
    return data + begin, data + end


def test_a_writer_in_another_pid_namespace_stops_the_node_copy(checkpoint: Path, tmp_path: Path) -> None:
    """An engine in a pid namespace of its own cannot see a process outside it that maps the checkpoint
    writable and shared (a container beside it); the kernel still knows the file is open for writing,
    and the engine refuses to share it, saying why, instead of keying a copy by times that may lie."""
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    model = copy / "model.safetensors"
    root = Path(__file__).parents[3]
    with subprocess.Popen(
        [sys.executable, "-c", REWRITER, str(model), *map(str, weight_bytes(model))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as writer:  # fmt: skip
        assert writer.stdout is not None and writer.stdout.readline().strip() == "mapped"
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", ENGINE_IN_ITS_PID_NAMESPACE, str(copy)],
            cwd=root, capture_output=True, text=True, timeout=WAIT_S,
        )  # fmt: skip
        writer.communicate(timeout=WAIT_S)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot make a pid namespace here: {done.stderr.strip()}")
    assert done.stdout == (
        f"{model} is open for writing by a process this engine cannot see (in another pid namespace, a container "
        "beside it, or one it may not read): its bytes may change without its times changing, so no node copy can "
        "be known to hold them; stop that writer, or set node_sharing 'off'\n"
    ), done.stderr


def test_a_copy_the_file_no_longer_matches_is_refused_before_it_is_attached(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the kernel cannot be asked about writers and none can be seen (a checkpoint of another user,
    a writer in another container), a writer may change a file's bytes without changing its times (a
    page it already dirtied, on tmpfs, which never writes it back): the next engine's key still names the
    copy. It compares rows drawn at random with the file before attaching, and refuses, saying why."""
    copy = Path("/dev/shm") / f"engram-test-ckpt-{os.getpid()}"
    shutil.copytree(checkpoint, copy)
    try:
        from engram.runtime.placement import node_sharing

        monkeypatch.setattr(node_sharing, "open_for_writing", lambda fd: None)  # not ours to ask about
        monkeypatch.setattr(node_sharing, "writers", lambda files: {})  # nor to see
        model = copy / "model.safetensors"
        table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
        fmt = ShardFormat(rows, SMALL.head_dim, SMALL.dtype)
        with subprocess.Popen(
            [sys.executable, "-c", REWRITER, str(model), *map(str, weight_bytes(model))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        ) as writer:  # fmt: skip
            assert writer.stdin is not None and writer.stdout is not None
            assert writer.stdout.readline().strip() == "mapped"
            writer.stdin.write("first\n")  # dirties every page of the rows: their times change here
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"
            loaded = node_shard(
                table, fmt, 0, rows, Checkpoint(copy), mode="node", device=torch.device("cpu"), progress=False
            )
            assert not loaded.attached
            times = os.stat(model)
            writer.stdin.write("second\n")  # the same pages again: no fault, no time changes
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"
            writer.stdin.close()
            writer.wait(timeout=WAIT_S)
        after = os.stat(model)
        assert (after.st_mtime_ns, after.st_ctime_ns) == (times.st_mtime_ns, times.st_ctime_ns)  # the premise
        with pytest.raises(EngramError) as refused:
            node_shard(table, fmt, 0, rows, Checkpoint(copy), mode="node", device=torch.device("cpu"), progress=False)
        message = str(refused.value)
        sampled = int(message.split(" rows sampled")[0].rsplit(" ", 1)[1])
        assert 2 < sampled <= 64
        assert message == (
            f"the node's copy of rows [0, {rows:,}) of {rows:,} of {table} as fp8 x 128 (one copy for the node) differs "
            f"from the checkpoint in {sampled} of {sampled} rows sampled: the file changed since pid {os.getpid()} loaded "
            "it, without its times changing (written through a mapping); restart the engines that map the copy (it "
            "goes with the last of them), or set node_sharing 'off'"
        )
        assert loaded.release()
    finally:
        shutil.rmtree(copy)


def test_the_look_through_proc_for_writers_stops_at_its_bound(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """writers() names a visible writer, and reads no process's maps once WRITERS_SCAN_S has passed (a
    node of processes with huge maps cannot hold a start up)."""
    from engram.runtime.placement import node_sharing

    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    model = copy / "model.safetensors"
    with subprocess.Popen(
        [sys.executable, "-c", REWRITER, str(model), *map(str, weight_bytes(model))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as writer:  # fmt: skip
        assert writer.stdout is not None and writer.stdout.readline().strip() == "mapped"
        assert node_sharing.writers([model]) == {str(model): [writer.pid]}
        monkeypatch.setattr(node_sharing, "WRITERS_SCAN_S", 0.0)
        assert node_sharing.writers([model]) == {}
        writer.communicate(timeout=WAIT_S)


def test_listeners_left_unasked_are_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without sock_diag each listener under our prefix is asked who it is, for at most OWNERS_S: ours is
    found; with no time left, none is, and that is said once, with the count left unasked."""
    from engram.runtime.placement import abstract_names, node_sharing

    monkeypatch.setattr(abstract_names, "bound", lambda prefix: None)  # the kernel cannot name owners
    monkeypatch.setattr(node_sharing, "_unasked_said", False)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ours:
        name = f"\0engram-node-{os.geteuid()}-{'e' * 24}"
        ours.bind(name)
        ours.listen(4)
        assert name in node_sharing.servers()
        monkeypatch.setattr(node_sharing, "OWNERS_S", -1.0)
        with caplog.at_level(logging.WARNING, logger="engram"):
            assert node_sharing.servers() == [] and node_sharing.servers() == []
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(
        "engram: the kernel cannot name socket owners here (no sock_diag), and "
    )
    assert " listeners named like this user's node copy servers were not asked who they are in -1 s: " in said[0]
