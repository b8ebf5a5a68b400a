"""What a kill -9 leaves half-written (the demo's checkpoint, a kernel build, a cache entry) is named for
its writer (engram.scratch) and removed by the next run once that writer is gone; a live writer's,
another user's and another pid namespace's are left alone."""

from __future__ import annotations

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
