"""node_dir: engines that see one rendezvous directory share one copy of each table whatever their network,
pid, mount, IPC, UTS and user namespaces (pods, simulated as processes in namespaces of their own); the
directory is checked before use (ours, writable by no one else, never a link) and names in it are reached
through its descriptor; what a killed engine leaves there holds nothing and is removed by the next one;
another uid can neither attach nor plant anything."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from engram.config import load_config
from engram.errors import ConfigError, EngramError
from engram.memory.mapping import PAGE
from engram.runtime.placement import rendezvous as rendezvous_module
from engram.runtime.placement.rendezvous import Rendezvous
from engram.runtime.shard import ShardFormat
from tests.other_user import OtherUser
from tests.runtime.placement.test_node_sharing import expected_digests, memory_cgroup
from tests.runtime.specs import SMALL

WAIT_S = 120.0
ROWS = 96  # rows [0, 96) of each table: every table of SMALL has more
REPO = Path(__file__).resolve().parents[3]
POD = (
    "import sys; from pathlib import Path; from tests.runtime import node_engine; "
    "node_engine.run(sys.argv[1], Path(sys.argv[2]), stage=sys.argv[5] or None, rows=int(sys.argv[3]), node_dir=sys.argv[4] or None)"
)
# A pod: its own network, pid (with its /proc), IPC, mount, UTS and time namespaces; killed with unshare.
NAMESPACES = ["--net", "--pid", "--ipc", "--mount", "--uts", "--time", "--fork", "--mount-proc", "--kill-child"]


class Pod:
    """tests.runtime.node_engine in namespaces of its own (NAMESPACES; `user`: a user namespace too, its root
    mapped to ours)."""

    def __init__(
        self,
        checkpoint: Path,
        report: Path,
        node_dir: Path | None,
        *,
        user: bool = False,
        stage: str = "",
        cgroup: Path | None = None,
    ) -> None:
        self.report = report
        command = ["unshare", *NAMESPACES, *(["--user", "--map-root-user"] if user else []), sys.executable, "-c", POD]
        args = [str(checkpoint), str(report), str(ROWS), str(node_dir or ""), stage]
        join = None if cgroup is None else lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        self.proc = subprocess.Popen(
            [*command, *args], cwd=REPO, stderr=subprocess.PIPE, text=True, preexec_fn=join
        )  # joins its memory cgroup before exec: all it starts is charged there

    def wait_file(self, suffix: str) -> dict[str, Any]:
        path = self.report.with_suffix(suffix)
        deadline = time.monotonic() + WAIT_S
        while not path.exists():
            if self.proc.poll() is not None:
                error = self.report.with_suffix(".error")
                said = (
                    error.read_text()[-3000:]
                    if error.exists()
                    else (self.proc.stderr.read() if self.proc.stderr else "")
                )
                if "unshare" in said and "Operation not permitted" in said:
                    pytest.skip(f"cannot make these namespaces here: {said.strip()}")
                raise AssertionError(f"the pod died: {said}")
            assert time.monotonic() < deadline, f"{path} never appeared"
            time.sleep(0.02)
        time.sleep(0.02)
        return json.loads(path.read_text())

    def ready(self) -> dict[str, Any]:
        return self.wait_file(".ready")

    def log(self) -> str:
        path = self.report.with_suffix(".log")
        return path.read_text() if path.exists() else ""

    def finish(self) -> None:
        self.report.with_suffix(".go").touch()
        self.report.with_suffix(".exit").touch()
        assert self.proc.wait(WAIT_S) == 0, self.report.with_suffix(".error").read_text()[-3000:]
        self.close()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)  # unshare's child goes with it (--kill-child)
        self.proc.wait(WAIT_S)
        self.close()

    def close(self) -> None:
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    path = tmp_path / "rendezvous"
    path.mkdir(mode=0o700)
    return path


def names_in(directory: Path) -> list[str]:
    return sorted(os.listdir(directory))


def shmem(cgroup: Path) -> int:
    """Shared-memory bytes charged to `cgroup` (a memfd's pages are charged to the first to touch them)."""
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return int(stat["shmem"])


@pytest.mark.slow
def test_pods_in_namespaces_of_their_own_share_one_copy_through_the_directory(
    checkpoint: Path, node_dir: Path, tmp_path: Path, cgroups: list[Path]
) -> None:
    pods = [Pod(checkpoint, tmp_path / "pod0", node_dir, cgroup=cgroups[0])]
    first = pods[0].ready()
    pods += [Pod(checkpoint, tmp_path / f"pod{i}", node_dir, user=i == 2, cgroup=cgroups[i]) for i in (1, 2, 3)]
    reports = [first] + [p.ready() for p in pods[1:]]
    charged = [shmem(c) for c in cgroups]
    for p in pods:
        p.finish()
    copies = sum(
        -(-ShardFormat(ROWS, SMALL.head_dim, SMALL.dtype).nbytes // PAGE) * PAGE + PAGE for _ in SMALL.table_names()
    )  # each copy's pages and its trailer page
    assert charged[0] >= copies and charged[1:] == [0, 0, 0]  # the loader's cgroup holds the copies, no other
    oracle = expected_digests(checkpoint, ROWS)
    assert all(r["digests"] == oracle for r in reports)
    assert first["origins"] == {name: ["loaded", first["pid"]] for name in oracle}
    for report in reports[1:]:  # the loader is in another pid namespace: the kernel names no pid of it
        assert report["origins"] == {name: ["attached", 0] for name in oracle}
    assert names_in(node_dir) == ["digests"]  # every pod named its socket there, and took its name with it


@pytest.mark.slow
def test_without_the_directory_each_pod_loads_its_own(checkpoint: Path, tmp_path: Path) -> None:
    """The case node_dir is for: abstract names live in a network namespace, which each pod has its own of."""
    pods = [Pod(checkpoint, tmp_path / f"pod{i}", None) for i in range(2)]
    reports = [p.ready() for p in pods]
    for p in pods:
        p.finish()
    assert all(set(origin for origin, _ in r["origins"].values()) == {"loaded"} for r in reports)


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["locked", "sealed", "serving"])
def test_a_pod_killed_while_loading_leaves_nothing_the_next_does_not_remove(
    stage: str, checkpoint: Path, node_dir: Path, tmp_path: Path
) -> None:
    loader = Pod(checkpoint, tmp_path / "loader", node_dir, stage=stage)
    assert loader.wait_file(".stage")["stage"] == stage
    waiter = Pod(checkpoint, tmp_path / "waiter", node_dir)
    deadline = time.monotonic() + WAIT_S
    while stage != "serving" and "waiting for another engine" not in waiter.log():
        assert time.monotonic() < deadline, waiter.log()
        time.sleep(0.02)
    loader.kill()
    report = waiter.ready()
    assert report["digests"] == expected_digests(checkpoint, ROWS)
    if stage != "serving":  # once serving, the killed loader's copy may have been attached before the kill
        assert set(origin for origin, _ in report["origins"].values()) == {"loaded"}
    waiter.finish()
    Rendezvous(str(node_dir)).servers()  # the next engine's look: what the killed one left goes
    assert names_in(node_dir) == ["digests"]


def test_a_missing_directory_is_made_ours_alone(tmp_path: Path) -> None:
    made = tmp_path / "made"
    Rendezvous(str(made))
    info = made.stat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o722])
def test_a_directory_others_can_write_is_refused_saying_how_to_fix_it(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "shared"
    path.mkdir()
    path.chmod(mode)
    with pytest.raises(EngramError) as refused:
        Rendezvous(str(path))
    uid = os.geteuid()
    assert str(refused.value) == (
        f"node_dir {path} can be written by other users (mode {mode:04o}); make it a directory of uid {uid} that "
        f"only it can write (chown {uid} {path} && chmod 0700 {path}), or name one that is"
    )


def test_a_directory_that_cannot_be_made_is_refused_saying_why(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-parent" / "rendezvous"
    with pytest.raises(EngramError) as refused:
        Rendezvous(str(missing))
    assert str(refused.value).startswith(f"node_dir {missing}: cannot create it (No such file or directory); ")


def test_a_directory_of_another_uid_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another uid needs root")
    path = tmp_path / "theirs"
    path.mkdir(mode=0o700)
    os.chown(path, 54_321, 54_321)
    with pytest.raises(EngramError) as refused:
        Rendezvous(str(path))
    assert str(refused.value).startswith(f"node_dir {path} belongs to uid 54321, not this engine's {os.geteuid()}; ")


def test_a_link_at_the_name_is_never_followed(tmp_path: Path, node_dir: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(node_dir)
    with pytest.raises(EngramError) as refused:
        Rendezvous(str(link))
    assert str(refused.value) == f"node_dir {link} is a link, which is never followed: name the directory itself"


def test_the_overflow_uid_is_refused(node_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rendezvous_module, "overflow_uid", os.geteuid)
    with pytest.raises(EngramError) as refused:
        Rendezvous(str(node_dir))
    assert "runs as the overflow uid" in str(refused.value)


def test_names_are_reached_through_the_descriptor_not_the_path(tmp_path: Path, node_dir: Path) -> None:
    """Moving the directory (or putting another at its name) after it was opened changes nothing."""
    place = Rendezvous(str(node_dir))
    listener = place.listen()
    moved = tmp_path / "moved"
    node_dir.rename(moved)
    node_dir.mkdir(mode=0o700)  # a directory of ours at the old name: not where the sockets are
    try:
        [address] = place.servers()
        assert os.listdir(moved) == [address.rsplit("/", 1)[1]] and os.listdir(node_dir) == []
        place.close(listener)
        assert os.listdir(moved) == []
    finally:
        os.close(place.fd)


def test_dead_names_are_removed_and_live_ones_kept(node_dir: Path) -> None:
    place = Rendezvous(str(node_dir))
    try:
        live = place.listen()
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(str(node_dir / "s-0-dead"))  # bound, listener gone: a killed server's name
        dead.close()
        old = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old.bind(str(node_dir / "t-0-old"))  # bound long ago, never listening
        os.utime(node_dir / "t-0-old", (time.time() - 3600, time.time() - 3600), follow_symlinks=False)
        young = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        young.bind(str(node_dir / "t-0-young"))  # a server between bind and listen
        (node_dir / ("l-" + "0" * 48)).write_text("")  # a load lock no one holds: a killed loader's
        (node_dir / "s-0-link").symlink_to("/proc/self/fd/0")  # a link: never followed, never removed
        [address] = place.servers()
        [name] = [n for n in names_in(node_dir) if n.startswith("s-") and n != "s-0-link"]
        assert address == place.address(name)
        assert names_in(node_dir) == sorted([name, "s-0-link", "t-0-young"])
        place.close(live)
        old.close()
        young.close()
    finally:
        os.close(place.fd)


def test_a_load_lock_is_held_once_and_goes_with_its_holder(node_dir: Path) -> None:
    place = Rendezvous(str(node_dir))
    digest = "ab" * 32
    try:
        held = place.lock(digest)
        assert held is not None and place.locked(digest)
        assert place.lock(digest) is None  # another open file description: refused
        place.unlock(digest, held)
        assert not place.locked(digest) and names_in(node_dir) == []
        code = (
            "import sys, time; from engram.runtime.placement.rendezvous import Rendezvous; "
            "p = Rendezvous(sys.argv[1]); assert p.lock(sys.argv[2]) is not None; print('held', flush=True); time.sleep(600)"
        )
        with subprocess.Popen(
            [sys.executable, "-c", code, str(node_dir), digest], cwd=REPO, stdout=subprocess.PIPE, text=True
        ) as holder:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            assert place.locked(digest) and place.lock(digest) is None
            holder.kill()
            holder.wait(WAIT_S)
        assert not place.locked(digest)  # the kernel dropped it with its holder; its name is left
        assert names_in(node_dir) == ["l-" + digest[:48]]
        place.servers()
        assert names_in(node_dir) == []
    finally:
        os.close(place.fd)


# Another uid, given a way into our directory (mode 0755): it can neither connect to our copy server nor
# plant a name we would use (it cannot write there).
STRANGER = r"""
import json, os, socket, sys
directory = sys.argv[1]
tried = {}
for name in os.listdir(directory):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.path.join(directory, name))
        tried[name] = "connected"
    except OSError as exc:
        tried[name] = type(exc).__name__
try:
    open(os.path.join(directory, "s-0-planted"), "w")
    tried["plant"] = "planted"
except OSError as exc:
    tried["plant"] = type(exc).__name__
print(json.dumps(tried))
"""


def test_another_uid_can_neither_connect_nor_plant(other_user: OtherUser) -> None:
    node_dir = Path(tempfile.mkdtemp(prefix="engram-test-rendezvous-", dir="/dev/shm"))  # a path it can reach
    node_dir.chmod(0o755)
    place = Rendezvous(str(node_dir))
    try:
        listener = place.listen()
        tried = json.loads(other_user.run(STRANGER, str(node_dir)))
        [name] = names_in(node_dir)
        assert tried == {name: "PermissionError", "plant": "PermissionError"}
        place.close(listener)
    finally:
        os.close(place.fd)
        shutil.rmtree(node_dir)


def test_node_dir_comes_from_the_environment_checked_as_the_field() -> None:
    config = load_config({"cpu_offload": True, "node_sharing": "node"}, env={"ENGRAM_NODE_DIR": "/run/engram"})
    assert config.node_dir == "/run/engram"
    given = load_config({"cpu_offload": True, "node_sharing": "node", "node_dir": "/a"}, env={"ENGRAM_NODE_DIR": "/b"})
    assert given.node_dir == "/a"  # a value given wins
    with pytest.raises(ConfigError) as bad:
        load_config({"cpu_offload": True, "node_sharing": "node"}, env={"ENGRAM_NODE_DIR": "run/engram"})
    assert [(p.path, p.rule) for p in bad.value.errors] == [("/engram/node_dir", "pattern")]
    assert bad.value.errors[0].message.startswith("ENGRAM_NODE_DIR='run/engram': expected a match for the pattern '^/'")
    with pytest.raises(ConfigError) as off:
        load_config({"cpu_offload": True}, env={"ENGRAM_NODE_DIR": "/run/engram"})
    assert [(p.path, p.rule) for p in off.value.errors] == [("/engram/node_dir", "node-dir-needs-node-sharing")]


@pytest.mark.slow
def test_doctor_reports_the_directory_and_a_copy_a_pod_serves(
    checkpoint: Path,
    node_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engram.cli import main

    pod = Pod(checkpoint, tmp_path / "pod", node_dir)
    pod.ready()
    [engine] = Path(f"/proc/{pod.proc.pid}/task/{pod.proc.pid}/children").read_text().split()  # as we see it
    cgroup = memory_cgroup(engine)
    (node_dir / ("l-" + "1" * 48)).write_text("")  # a killed loader's lock file
    monkeypatch.setenv("ENGRAM_NODE_DIR", str(node_dir))
    try:
        assert main(["doctor", "--json", "--engram-config.node_sharing", "node"]) == 0
    finally:
        pod.finish()
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)}
    net = os.readlink("/proc/self/ns/net").split(":", 1)[1].strip("[]")
    assert f"net {net}, " in checks["namespaces"]["detail"]
    assert checks["namespaces"]["detail"].endswith(f"node copies are found in {node_dir}, from any namespace")
    assert checks["node_dir"]["status"] == "pass"
    assert checks["node_dir"]["detail"].startswith(f"{node_dir}: 1 engine(s) serving copies, 0 load(s) under way, ")
    detail = checks["node copies"]["detail"]
    assert detail.startswith(f"{len(SMALL.table_names())} held now: ")
    for name, rows in zip(SMALL.table_names(), SMALL.layout.table_rows, strict=True):
        copy = f"rows [0, {ROWS:,}) of {rows:,} of {name} as fp8 x 128 (one copy for the node)"
        # the pod's pid namespace is a child of ours: the kernel gives its loader's pid as we see it
        assert f"{copy}, 0.0 MiB, loaded by pid {engine} (cgroup {cgroup}), mapped by pids {engine}" in detail
    assert "l-" + "1" * 48 not in os.listdir(node_dir)
