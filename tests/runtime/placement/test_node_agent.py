"""The node agent (`engram node-agent`): pods ask it for the copies they find nowhere, so the copies' pages
are charged to the agent's cgroup, none to a pod's; a restarted agent takes on the copies pods still map;
pods whose agent is down wait for it, then load their own with one warning; an agent refuses what its
memory cannot hold, and rows of files that are not what the request's key says. Each pod and the agent
run in namespaces and a memory cgroup of their own (tests.runtime.placement.test_node_dir)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.memory.mapping import PAGE
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement import agent_requests, node_agent
from engram.runtime.placement.agent_requests import Wanted
from engram.runtime.placement.node_copy import obtain_rows, share_key, table_files
from engram.runtime.placement.rendezvous import Rendezvous
from engram.runtime.shard import ShardFormat
from tests.runtime.placement.test_node_dir import NAMESPACES, REPO, ROWS, Pod, shmem
from tests.runtime.placement.test_node_sharing import NOTHING, expected_digests, settled
from tests.runtime.specs import SMALL

WAIT_S = 120.0
FORMAT = ShardFormat(ROWS, SMALL.head_dim, SMALL.dtype)
COPIES = len(SMALL.table_names()) * (-(-FORMAT.nbytes // PAGE) * PAGE + PAGE)  # their pages and trailers


# The agent as the command runs it, but stopped at one stage of its first load (tests.runtime.node_engine's
# pause_at), which it tells in REPORT.stage.
PAUSED_AGENT = (
    "import sys; from pathlib import Path; from tests.runtime import node_engine; "
    "node_engine.pause_at(sys.argv[2], Path(sys.argv[3])); from engram.cli import main; "
    "sys.exit(main(['node-agent', '--node-dir', sys.argv[1]]))"
)


class Agent:
    """`engram node-agent` in namespaces (and a memory cgroup) of its own; `paused`: (stage, report) where
    its first load stops."""

    def __init__(self, node_dir: Path, cgroup: Path | None = None, paused: tuple[str, Path] | None = None) -> None:
        join = None if cgroup is None else lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        command = ["-m", "engram", "node-agent", "--node-dir", str(node_dir)]
        if paused is not None:
            command = ["-c", PAUSED_AGENT, str(node_dir), paused[0], str(paused[1])]
        self.proc = subprocess.Popen(
            ["unshare", *NAMESPACES, sys.executable, *command],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=join,
        )  # fmt: skip
        assert self.proc.stdout is not None
        self.said = self.proc.stdout.readline()
        assert self.said.startswith("engram node-agent: serving "), self.said + self.proc.stderr.read()  # type: ignore[union-attr]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT_S)
        self.close()

    def stop(self) -> None:
        [agent] = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        os.kill(int(agent), signal.SIGTERM)  # to the agent itself: unshare ignores it while it waits
        assert self.proc.wait(WAIT_S) == 0
        self.close()

    def close(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def started() -> Iterator[list[Pod | Agent]]:
    """The pods and agents a test starts: any still running when it ends (a failed assertion) is killed."""
    running: list[Pod | Agent] = []
    yield running
    for each in running:
        if each.proc.poll() is None:
            each.proc.kill()  # unshare's child goes with it (--kill-child)
            each.proc.wait(WAIT_S)
        each.close()


@pytest.fixture
def node_dir(tmp_path: Path) -> Path:
    path = tmp_path / "rendezvous"
    path.mkdir(mode=0o700)
    return path


@pytest.mark.slow
def test_the_agents_cgroup_holds_the_copies_and_no_pods(
    checkpoint: Path, node_dir: Path, tmp_path: Path, cgroups: list[Path], started: list[Pod | Agent]
) -> None:
    agent = Agent(node_dir, cgroups[0])
    pods = [Pod(checkpoint, tmp_path / f"pod{i}", node_dir, cgroup=cgroups[i]) for i in (1, 2)]
    started += [agent, *pods]
    reports = [p.ready() for p in pods]
    charged = [shmem(c) for c in cgroups[:3]]
    for p in pods:
        p.finish()
    agent.stop()
    oracle = expected_digests(checkpoint, ROWS)
    for report in reports:  # the agent loaded every copy; it runs in another pid namespace
        assert report["origins"] == {name: ["attached", 0] for name in oracle}
        assert report["digests"] == oracle
    assert charged[0] >= COPIES and charged[1:] == [0, 0]
    assert sorted(os.listdir(node_dir)) == ["agent", "digests"]  # the mark stays for its next start


@pytest.mark.slow
def test_a_restarted_agent_takes_on_the_copies_pods_still_map(
    checkpoint: Path, node_dir: Path, tmp_path: Path, cgroups: list[Path], started: list[Pod | Agent]
) -> None:
    first = Agent(node_dir, cgroups[0])
    holder = Pod(checkpoint, tmp_path / "holder", node_dir, cgroup=cgroups[1])
    started += [first, holder]
    holder.ready()
    first.kill()
    second = Agent(node_dir, cgroups[2])
    started.append(second)
    assert f"{len(SMALL.table_names())} copies taken on" in second.said
    holder.finish()  # the agent alone holds them now
    later = Pod(checkpoint, tmp_path / "later", node_dir, cgroup=cgroups[3])
    started.append(later)
    report = later.ready()
    later.finish()
    second.stop()
    assert report["origins"] == {name: ["attached", 0] for name in SMALL.table_names()}
    assert report["digests"] == expected_digests(checkpoint, ROWS)


@pytest.mark.slow
def test_pods_whose_agent_is_down_wait_then_load_their_own(
    checkpoint: Path, node_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: list[Pod | Agent]
) -> None:
    (node_dir / "agent").write_text("")  # an agent served this directory, and is down now
    monkeypatch.setenv("ENGRAM_AGENT_WAIT_S", "1")
    pod = Pod(checkpoint, tmp_path / "pod", node_dir)
    started.append(pod)
    report = pod.ready()
    pod.finish()
    assert report["origins"] == {name: ["loaded", report["pid"]] for name in SMALL.table_names()}
    said = [line for line in pod.log().splitlines() if "node agent" in line]  # the log holds INFO lines too
    assert len(said) == len(SMALL.table_names())  # one per table it loaded; the first waited, no other
    assert said[0].endswith(
        f": the node agent of {node_dir} did not come up in 1 s (down or restarting); this engine loads it"
    )
    assert all(
        line.endswith(
            f": the node agent of {node_dir} is not running (this engine waited for it once); this engine loads it"
        )
        for line in said[1:]
    )


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["filling", "locked", "loaded", "sealed", "serving"])
def test_an_agent_killed_while_it_loads_leaves_nothing_and_the_pod_loads_its_own(
    stage: str,
    checkpoint: Path,
    node_dir: Path,
    tmp_path: Path,
    started: list[Pod | Agent],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENGRAM_AGENT_WAIT_S", "1")  # its other tables: the agent is gone, not restarting
    report = tmp_path / "agent"
    agent = Agent(node_dir, paused=(stage, report))
    pod = Pod(checkpoint, tmp_path / "pod", node_dir)
    started += [agent, pod]
    deadline = time.monotonic() + WAIT_S
    while not report.with_suffix(".stage").exists():
        assert time.monotonic() < deadline and pod.proc.poll() is None, pod.log()
        time.sleep(0.02)
    agent.kill()
    told = pod.ready()
    pod.finish()
    assert told["digests"] == expected_digests(checkpoint, ROWS)
    assert set(origin for origin, _ in told["origins"].values()) == {"loaded"}
    assert "this engine loads it" in pod.log()
    Rendezvous(str(node_dir)).servers()  # the next look removes what the killed agent left
    assert sorted(os.listdir(node_dir)) == ["agent", "digests"]


def test_an_agent_refuses_what_its_memory_cannot_hold_and_files_that_are_not_the_key(
    small_checkpoint: Path, node_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = Checkpoint(small_checkpoint)
    table, rows = SMALL.table_names()[0], SMALL.layout.table_rows[0]
    key = share_key(checkpoint, table, rows, 0, FORMAT, None, str(node_dir))
    wanted = Wanted(table, ROWS, SMALL.head_dim, SMALL.dtype, 0, rows, None, key.digest)
    agent = node_agent.NodeAgent(str(node_dir))
    fds = [os.open(f, os.O_RDONLY) for f in table_files(checkpoint, table)]
    try:
        monkeypatch.setattr(node_agent, "free_bytes_now", lambda: 4096)
        total = -(-FORMAT.nbytes // PAGE) * PAGE + PAGE
        assert agent._serve(wanted, fds) == {
            "refused": f"the node agent has 4,096 bytes of memory left (its cgroup's limit less its use, and the "
            f"node's), and the copy takes {total:,}: raise the agent's memory limit"
        }
        monkeypatch.undo()
        other = Wanted(table, ROWS, SMALL.head_dim, SMALL.dtype, 0, rows, None, "0" * 64)  # a key the files are not
        assert agent._serve(other, fds) == {"refused": "the files sent hold other rows than the request's key names"}
        assert agent.held == {}
        assert agent._serve(wanted, fds) == {"served": True} and list(agent.held) == [key.digest]
    finally:
        for fd in fds:
            os.close(fd)
        agent.close()
        for copy in agent.held.values():
            copy.mapping.release()
        agent.held.clear()
    assert json.dumps(settled()) == json.dumps(NOTHING)


def test_an_agent_that_is_down_is_one_warning_for_all_tables(
    checkpoint: Path, node_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (node_dir / "agent").write_text("")  # an agent served this directory, and is down now
    monkeypatch.setenv("ENGRAM_AGENT_WAIT_S", "1")
    monkeypatch.setattr(agent_requests, "_gone", set())
    found = Checkpoint(checkpoint)
    copies = []
    with caplog.at_level(logging.INFO, logger="engram"):
        for table, rows in zip(SMALL.table_names(), SMALL.layout.table_rows, strict=True):
            copies.append(obtain_rows(found, table, FORMAT, 0, rows, node=None, node_dir=str(node_dir))[0])
    for copy in copies:
        copy.mapping.release()
    said = [(r.levelno, r.getMessage()) for r in caplog.records if "node agent" in r.getMessage()]
    assert [level for level, _ in said] == [logging.WARNING] + [logging.INFO] * (len(SMALL.table_names()) - 1)
    assert said[0][1].endswith("did not come up in 1 s (down or restarting); this engine loads it")
