"""A shared table cannot outlive its processes: killed at the instant it is created, by the leader or a
peer, it is freed by the kernel (memfd) or reclaimed by the next start and `engram doctor --clean`
(a named file in ENGRAM_SHM_DIR)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil
import pytest

from engram.apps.local_ranks import run_local
from engram.cli import main
from engram.runtime.placement.shm import stale_files
from tests.runtime import workers

SIZE = 512 << 20


def shmem_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


def kill_when(seen: Callable[[int], bool], victim: int, pids: list[int]) -> Callable[[Sequence[object]], None]:
    """on_start hook: poll the leader until `seen(leader_pid)`, then SIGKILL rank `victim`."""

    def hook(procs: Sequence[object]) -> None:
        pids.extend(p.pid for p in procs)  # type: ignore[attr-defined]
        leader = procs[0].pid  # type: ignore[attr-defined]
        deadline = time.monotonic() + 60
        while not seen(leader) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert seen(leader), "the shared table never appeared"
        os.kill(procs[victim].pid, signal.SIGKILL)  # type: ignore[attr-defined]

    return hook


def holds_memfd(pid: int) -> bool:
    try:
        return any(
            "memfd:engram-kill-test" in os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
        )
    except OSError:
        return False


def assert_all_gone(pids: list[int]) -> None:
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_memfd_table_killed_at_creation_is_freed(victim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_SHM_DIR", raising=False)
    before = shmem_bytes()
    pids: list[int] = []
    outcomes = run_local(
        2, workers.share_then_wait, SIZE, 2.0, timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "5"},
        on_start=kill_when(holds_memfd, victim, pids),
    )  # fmt: skip
    dead, survivor = outcomes[victim], outcomes[1 - victim]
    assert dead.exitcode == -9
    assert survivor.error is not None and "Traceback" not in survivor.error and "\n" not in survivor.error
    assert_all_gone(pids)
    deadline = time.monotonic() + 10
    while shmem_bytes() > before + SIZE // 4 and time.monotonic() < deadline:  # the kernel frees it
        time.sleep(0.1)
    assert shmem_bytes() < before + SIZE // 4


@pytest.mark.slow
def test_memfd_table_is_shared_and_leaves_no_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENGRAM_SHM_DIR", raising=False)
    before = {p.name for p in Path("/dev/shm").iterdir()}
    outcomes = run_local(3, workers.share_then_wait, 1 << 20, 0.0, timeout=120)
    assert [o.value for o in outcomes] == [1 << 20] * 3
    assert {p.name for p in Path("/dev/shm").iterdir()} == before


@pytest.mark.slow
def test_named_table_peer_killed_leader_removes_its_file(shm_tmp: Path) -> None:
    pids: list[int] = []
    outcomes = run_local(
        2, workers.share_then_wait, SIZE, 3.0, timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "5"},
        on_start=kill_when(lambda _: any(shm_tmp.glob("engram-kill-test-*")), 1, pids),
    )  # fmt: skip
    assert outcomes[1].exitcode == -9
    assert outcomes[0].error is not None and "\n" not in outcomes[0].error
    assert_all_gone(pids)
    assert list(shm_tmp.iterdir()) == []  # the surviving leader deleted its own file


@pytest.mark.slow
def test_named_table_leader_killed_is_reclaimed(shm_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The leader killed between its table's creation and the hand-over: its file names a dead owner, and
    the launcher removes it once its ranks are gone; left by engines another launcher ran, `engram doctor
    --clean` removes such a file (a killed leader's, planted here as it would be named)."""
    pids: list[int] = []
    outcomes = run_local(
        2, workers.share_then_wait, SIZE, 3.0, timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "5"},
        on_start=kill_when(lambda _: any(shm_tmp.glob("engram-kill-test-*")), 0, pids),
    )  # fmt: skip
    assert outcomes[0].exitcode == -9 and outcomes[1].error is not None
    assert_all_gone(pids)
    assert list(shm_tmp.iterdir()) == []
    from engram.scratch import owner_tag

    planted = shm_tmp / f"engram-kill-test-{owner_tag().rsplit('-', 2)[0]}-{pids[0]}-1-{'0' * 32}"
    planted.write_bytes(b"rows")
    assert stale_files(shm_tmp) == [planted]  # its owner is dead: recorded in its name
    assert main(["doctor", "--clean", "--json"]) in (0, 1)
    out = capsys.readouterr().out
    assert out.startswith(f"removed 1 shared table file(s) left by crashed processes in {shm_tmp}")
    assert list(shm_tmp.iterdir()) == []


def test_a_live_owner_is_never_reclaimed(shm_tmp: Path) -> None:
    from engram.scratch import owner_tag

    mine = shm_tmp / f"engram-layers-1-engram-embed-{owner_tag()}-{'0' * 32}"
    mine.write_bytes(b"x")
    dead = shm_tmp / f"engram-layers-1-engram-embed-{owner_tag().rsplit('-', 2)[0]}-999999999-1-{'0' * 32}"
    dead.write_bytes(b"x")
    other_boot = shm_tmp / f"engram-t-000000000000-999999999-1-{'0' * 32}"
    other_boot.write_bytes(b"x")
    assert stale_files(shm_tmp) == [dead]


@pytest.mark.parametrize("kind", ["missing", "read-only"])
def test_an_unusable_shm_dir_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    directory = tmp_path / "shm"
    if kind == "read-only":  # a read-only tmpfs: even root cannot create there
        directory.mkdir()
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(directory)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if mounted.returncode != 0:
            pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    monkeypatch.setenv("ENGRAM_SHM_DIR", str(directory))
    try:
        outcomes = run_local(2, workers.share_then_wait, 1 << 20, 0.0, timeout=120)
    finally:
        if kind == "read-only":
            subprocess.run(["umount", str(directory)], check=False, timeout=30)
    for outcome in outcomes:
        assert outcome.error is not None and "Traceback" not in outcome.error
        assert (
            "could not create the shared table kill-test: cannot use" in outcome.error
            or "cannot create" in outcome.error
        )
        assert "ENGRAM_SHM_DIR" in outcome.error


BAR_CHILD = """
import multiprocessing as mp, sys, time

def replica(kind):
    if kind == "engram":
        from engram.runtime.checkpoints.loader import Progress as bar
    else:
        from tqdm import tqdm as bar
    with bar(total=1, disable=True):
        print("ready", flush=True)
        time.sleep(60)

if __name__ == "__main__":
    child = mp.get_context("spawn").Process(target=replica, args=(sys.argv[1],))
    child.start()
    child.join()
"""


def semaphores() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("sem.")}


@pytest.mark.parametrize("kind, leaks", [("engram", False), ("tqdm", True)])
def test_a_killed_replica_with_a_progress_bar_leaves_no_semaphore(tmp_path: Path, kind: str, leaks: bool) -> None:
    """`kill -9` of a whole process group (multiprocessing's resource tracker included) while a spawned
    replica holds a progress bar: tqdm's own lock leaves /dev/shm/sem.mp-* behind, the loader's does not."""
    before = semaphores()
    root = Path(__file__).resolve().parents[3]
    script = tmp_path / "bar_child.py"
    script.write_text(BAR_CHILD)
    process = subprocess.Popen(
        [sys.executable, str(script), kind],
        stdout=subprocess.PIPE, text=True, start_new_session=True, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        time.sleep(0.5)  # the group's processes are gone once the kernel has reaped them
        left = semaphores() - before
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        process.stdout.close()  # type: ignore[union-attr]
    for name in left:
        os.unlink(f"/dev/shm/{name}")  # the baseline's leak, cleaned up
    assert bool(left) is leaks, left
