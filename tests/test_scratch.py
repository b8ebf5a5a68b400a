"""What a kill -9 leaves half-written (the demo's checkpoint, a kernel build, a cache entry) is named for
its writer (engram.scratch) and removed by the next run once that writer is gone; a live writer's,
another user's and another pid namespace's are left alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engram.scratch import reclaim_scratch, scratch_name

ROOT = Path(__file__).resolve().parents[1]


def killed_child(code: str, env: dict[str, str]) -> None:
    """Run `code` in a child that kills itself with SIGKILL at the instant the code reaches `die()`."""
    prelude = "import os, signal\ndef die():\n    os.kill(os.getpid(), signal.SIGKILL)\n"
    done = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT, env={**os.environ, **env},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def dot_entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_the_demo_checkpoint_killed_while_written_leaves_nothing_after_the_next_run(tmp_path: Path) -> None:
    env = {"ENGRAM_CACHE_DIR": str(tmp_path)}
    killed_child(
        """
        from engram.apps import demo
        from engram.apps.presets import get_preset
        real = demo.write_checkpoint
        def half(spec, out, seed):
            (out / "model.safetensors").write_bytes(b"half")
            die()
        demo.write_checkpoint = half
        demo.cached_checkpoint(get_preset("tiny"))
        """,
        env,
    )
    checkpoints = tmp_path / "checkpoints"
    assert len(dot_entries(checkpoints)) == 1  # the killed writer's staging directory
    done = subprocess.run(
        [sys.executable, "-c", "from engram.apps import demo; from engram.apps.presets import get_preset; print(demo.cached_checkpoint(get_preset('tiny')))"],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert dot_entries(checkpoints) == [] and [p.name for p in checkpoints.iterdir()] == [
        Path(done.stdout.strip()).name
    ]


def test_a_build_killed_while_compiling_leaves_nothing_after_the_next_build(tmp_path: Path) -> None:
    source = tmp_path / "one.c"
    source.write_text("int one(void) { return 1; }\n")
    env = {"ENGRAM_CACHE_DIR": str(tmp_path / "cache")}
    killed_child(
        f"""
        from pathlib import Path
        from engram.ops import build
        real = build.subprocess.run
        def compile_then_die(command, **kwargs):
            done = real(command, **kwargs)
            if "-o" in command:  # the compile itself, not `cc --version`
                die()
            return done
        build.subprocess.run = compile_then_die
        build.build_library("one", [Path({str(source)!r})], "cc", ["-shared", "-fPIC"])
        """,
        env,
    )
    built = tmp_path / "cache" / "build"
    assert len(dot_entries(built)) == 1  # the killed build's output, never renamed
    done = subprocess.run(
        [sys.executable, "-c", f"from pathlib import Path; from engram.ops.build import build_library; print(build_library('one', [Path({str(source)!r})], 'cc', ['-shared', '-fPIC']))"],
        cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert dot_entries(built) == [] and [p.name for p in built.iterdir()] == [Path(done.stdout.strip()).name]


def test_only_a_gone_writers_scratch_of_ours_is_removed(tmp_path: Path) -> None:
    ours = tmp_path / scratch_name("mine")  # this live process's
    ours.write_bytes(b"")
    done = subprocess.run(
        [sys.executable, "-c", "from engram.scratch import scratch_name; print(scratch_name('gone', '.so'))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    gone = tmp_path / done.stdout.strip()  # a name its writer made, then exited
    gone.write_bytes(b"")
    (tmp_path / (gone.name + "-dir")).mkdir()  # not a scratch name: a suffix after the random part
    theirs = tmp_path / done.stdout.strip().replace("gone", "theirs")
    theirs.write_bytes(b"")
    if os.geteuid() == 0:
        os.chown(theirs, 54_321, 54_321)
    else:
        theirs.unlink()
    elsewhere = tmp_path / ".x.engram-tmp-000000000000-1-1-1-00"  # another boot's
    elsewhere.write_bytes(b"")
    link = tmp_path / done.stdout.strip().replace("gone", "link")
    link.symlink_to(ours)
    assert reclaim_scratch(tmp_path) == [gone.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (ours, theirs, elsewhere, link, tmp_path / (gone.name + "-dir")) if p.exists() or p.is_symlink()
    )


@pytest.mark.parametrize("suffix", ["", ".so"])
def test_scratch_names_are_fresh_and_hidden(suffix: str) -> None:
    names = {scratch_name("model.safetensors", suffix) for _ in range(100)}
    assert len(names) == 100 and all(
        n.startswith(".model.safetensors.engram-tmp-") and n.endswith(suffix) for n in names
    )


# A writer that makes a scratch file in argv[1], says its name, and lives until its stdin closes.
WRITER = """
import sys
from pathlib import Path
from engram.scratch import scratch_name
path = Path(sys.argv[1]) / scratch_name("model.safetensors")
path.write_bytes(b"half a checkpoint")
print(path.name, flush=True)
sys.stdin.read()
"""
RECLAIM = "import json, sys; from pathlib import Path; from engram.scratch import reclaim_scratch; print(json.dumps(reclaim_scratch(Path(sys.argv[1]))))"
TIME_NS = ["unshare", "--time", "--boottime", "100000"]
PID_NS_FOREIGN_PROC = ["unshare", "--pid", "--fork"]  # /proc stays the parent namespace's


def python_in(prefix: list[str], code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", code, *args], cwd=ROOT, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def reclaimed_in(prefix: list[str], directory: Path) -> list[str]:
    with python_in(prefix, RECLAIM, str(directory)) as proc:
        out, err = proc.communicate(timeout=120)
    if proc.returncode != 0 and "unshare" in err:
        pytest.skip(f"cannot make that namespace here: {err.strip()}")
    assert proc.returncode == 0, err
    return json.loads(out)


@pytest.mark.parametrize(
    ("writer_ns", "reclaimer_ns"), [(TIME_NS, []), ([], TIME_NS)], ids=["writer-in-time-ns", "reclaimer-in-time-ns"]
)
def test_a_live_writer_across_time_namespaces_keeps_its_scratch_and_a_gone_ones_is_reclaimed(
    tmp_path: Path, writer_ns: list[str], reclaimer_ns: list[str]
) -> None:
    """/proc/PID/stat shows start times shifted by the reader's time namespace: a live writer's name must
    still name a live process from the other side, and a gone writer's a gone one."""
    with python_in(writer_ns, WRITER, str(tmp_path)) as writer:
        assert writer.stdout is not None and writer.stdin is not None
        name = writer.stdout.readline().strip()
        if not name:
            pytest.skip(f"cannot make a time namespace here: {writer.communicate(timeout=60)[1].strip()}")
        assert reclaimed_in(reclaimer_ns, tmp_path) == []
        assert reclaim_scratch(tmp_path) == []
        assert (tmp_path / name).read_bytes() == b"half a checkpoint"
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    assert reclaimed_in(reclaimer_ns, tmp_path) == [name]
    assert list(tmp_path.iterdir()) == []


def test_where_proc_is_another_pid_namespaces_no_scratch_is_judged(tmp_path: Path) -> None:
    """In a pid namespace whose /proc is its parent's, our pid names another process there: a name made
    there says its owner cannot be told, and a reclaimer there removes nothing, not even a gone writer's."""
    with python_in(PID_NS_FOREIGN_PROC, WRITER, str(tmp_path)) as writer:
        assert writer.stdout is not None and writer.stdin is not None
        made = writer.stdout.readline().strip()
        if not made:
            pytest.skip(f"cannot make a pid namespace here: {writer.communicate(timeout=60)[1].strip()}")
        writer.stdin.close()
        assert writer.wait(timeout=60) == 0
    assert made.split(".engram-tmp-")[1].split("-")[1] == "0"  # pid namespace 0: no one can tell
    done = subprocess.run(
        [sys.executable, "-c", "from engram.scratch import scratch_name; print(scratch_name('gone'))"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    gone = tmp_path / done.stdout.strip()  # ours, its writer gone
    gone.write_bytes(b"")
    assert reclaimed_in(PID_NS_FOREIGN_PROC, tmp_path) == []
    assert reclaim_scratch(tmp_path) == [gone.name]  # here, where /proc is ours, it is told gone
    assert [p.name for p in tmp_path.iterdir()] == [made]
