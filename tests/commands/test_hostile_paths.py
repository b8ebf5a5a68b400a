"""Paths another user or a careless command line gives: `--out`/`--plot` never follow a link or replace
anything but a regular file, `make-checkpoint --out` writes only into a directory of ours that no one else
can write and leaves nothing when it fails, and the user's cache never loads what another uid could write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.cli import main
from engram.errors import EngramError
from engram.output_files import write_output
from tests.other_user import OtherUser

PROFILE = ["profile", "--preset", "tiny", "--tokens", "8192", "--held-out-tokens", "2000"]


def _special(kind: str, at: Path, victim: Path) -> None:
    if kind == "symlink":
        at.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(at)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(at, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # a second /dev/null
    else:
        os.symlink("/dev/null", at)  # a link to a device node


@pytest.mark.parametrize("kind", ["symlink", "fifo", "device", "link-to-device"])
def test_profile_out_refuses_what_is_not_a_regular_file(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep me")
    out = tmp_path / "hot.safetensors"
    _special(kind, out, victim)
    assert main([*PROFILE, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "engram writes only a regular file or a new name there" in err
    assert victim.read_bytes() == b"keep me"
    assert out.is_symlink() or out.is_fifo() or out.is_char_device()  # still what it was


def test_a_name_swapped_after_the_check_is_still_refused(tmp_path: Path) -> None:
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep me")
    out = tmp_path / "plot.png"
    out.symlink_to(victim)
    with pytest.raises(EngramError, match="is a symbolic link"):
        write_output("--plot", out, b"png bytes")
    assert victim.read_bytes() == b"keep me" and out.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "precious"]  # no temporary left


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    out = tmp_path / "hot.safetensors"
    out.write_bytes(b"old and longer than the new bytes")
    write_output("--out", out, b"new")
    assert out.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["hot.safetensors"]


MAKE = ["make-checkpoint", "--preset", "tiny"]


def test_make_checkpoint_refuses_a_directory_another_user_made_with_links_planted_in_it(
    other_user: OtherUser, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another user makes the output directory first and plants links at every name engram writes there:
    it is refused, with why and what to do, and nothing is written through the links."""
    victim = tmp_path / "bashrc"
    victim.write_bytes(b"the victim's own")
    out = Path("/tmp") / f"engram-planted-{os.getpid()}"
    other_user.run(
        "import os, sys; os.mkdir(sys.argv[1]); [os.symlink(sys.argv[2], os.path.join(sys.argv[1], n)) "
        "for n in ('config.json', 'SHA256SUMS', 'model.safetensors')]", str(out), str(victim),
    )  # fmt: skip
    try:
        assert main([*MAKE, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"error: the checkpoint directory {out} is owned by uid {other_user.uid}, not by you (uid 0), so files "
            "written there could be swapped after they are checked; choose a directory only you can write (or "
            "make it: engram creates a missing one)\n"
        )
        assert victim.read_bytes() == b"the victim's own"
        assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
    finally:
        other_user.run("import shutil, sys; shutil.rmtree(sys.argv[1])", str(out))


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_make_checkpoint_refuses_a_directory_others_can_write(
    mode: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "open"
    out.mkdir()
    out.chmod(mode)
    assert main([*MAKE, "--out", str(out)]) == 2
    assert f"has mode {mode:o}: other users can write into it" in capsys.readouterr().err
    assert list(out.iterdir()) == []


def test_make_checkpoint_refuses_links_in_its_own_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A link at a name it writes, even in a directory of ours, is refused, never written through."""
    victim = tmp_path / "precious"
    victim.write_bytes(b"keep me")
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").symlink_to(victim)
    assert main([*MAKE, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"error: {out / 'config.json'} is a symbolic link, where engram writes a file of that name: move it away, "
        "or write elsewhere\n"
    )
    assert victim.read_bytes() == b"keep me"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # no scratch left


@pytest.mark.parametrize("fails_at", ["model.safetensors", "config.json", "SHA256SUMS"])
def test_a_failed_make_checkpoint_leaves_no_temporary_file(
    fails_at: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever name fails (here: a directory sits there), the temporary checkpoint goes with the run."""
    out = tmp_path / "ckpt"
    (out / fails_at).mkdir(parents=True)
    assert main([*MAKE, "--out", str(out)]) == 2
    assert f"{out / fails_at} is a directory, where engram writes a file" in capsys.readouterr().err
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_a_make_checkpoint_that_fails_in_a_directory_it_made_removes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engram.runtime.checkpoints import writer

    def full_disk(tensors: object, path: str) -> None:
        Path(path).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "save_file", full_disk)
    assert main([*MAKE, "--out", str(tmp_path / "new" / "ckpt")]) == 2
    assert list((tmp_path / "new").iterdir()) == []


def test_make_checkpoint_writes_every_file_whole(tmp_path: Path) -> None:
    """The model file, config.json and SHA256SUMS, checked by `sha256sum -c` itself; no scratch left."""
    out = tmp_path / "ckpt"
    assert main([*MAKE, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["SHA256SUMS", "config.json", "model.safetensors"]
    done = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "model.safetensors: OK\n"


# A library whose constructor leaves a mark: loaded by the caller (root), it would run as root.
PLANTED = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) { close(open(MARK, O_CREAT | O_WRONLY, 0644)); }
"""


def test_a_kernel_library_planted_in_a_shared_cache_is_never_loaded(
    other_user: OtherUser,
    open_directory: Callable[[int], Path],
    tmp_path: Path,
) -> None:
    from engram.ops import cpu
    from engram.ops.build import KERNELS, library_name

    shared = open_directory(0o777)  # ENGRAM_CACHE_DIR everyone can write
    mark = tmp_path / "planted-code-ran"
    source = tmp_path / "planted.c"
    source.write_text(PLANTED)
    library = tmp_path / "planted.so"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-shared", "-fPIC", f'-DMARK="{mark}"', "-o", library, source], check=True, timeout=120)
    name = library_name("engram_cpu", sorted((KERNELS / "cpu").glob("*.c")), cc, cpu.FLAGS)
    plant = (  # as the other user: make each directory (theirs, open to all) and put the library in it
        "import os, shutil, sys\n"
        "for d in sys.argv[2:]:\n"
        "    os.makedirs(d, exist_ok=True); os.chmod(d, 0o777); shutil.copy(sys.argv[1], d)\n"
    )
    staged = shared / name  # the library under the cache's own name, for the other user to copy from
    staged.write_bytes(library.read_bytes())
    os.chmod(staged, 0o644)
    targets = [shared / "build", shared / f"user-{os.geteuid()}", shared / f"user-{os.geteuid()}" / "build"]
    other_user.run(plant, str(staged), *map(str, targets))
    done = subprocess.run(
        [sys.executable, "-m", "engram", "doctor", "--json"],
        env={**os.environ, "ENGRAM_CACHE_DIR": str(shared)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert not mark.exists(), "a library another user planted ran in our process"
    assert "Traceback" not in done.stderr
    assert f"the cache directory {shared / f'user-{os.geteuid()}'} is owned by uid {other_user.uid}" in done.stdout
