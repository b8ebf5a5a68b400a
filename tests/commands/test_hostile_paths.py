"""Paths another user or a careless command line gives: `--out`/`--plot` never follow a link or replace
anything but a regular file, and the user's cache never loads what another uid could write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engram.apps.output_files import write_output
from engram.cli import main
from engram.errors import EngramError
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
