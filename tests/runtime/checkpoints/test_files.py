"""open_for_writing: whether any process, in any pid namespace, has a file open for writing or mapped
writable, asked of the kernel (a read lease it refuses); None where engram may not take a lease (a file
neither ours nor leasable without CAP_LEASE), never a guess. The oracle is what each case did to the
file, and the lease syscall's own answer."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram.runtime.checkpoints.files import open_for_writing

ROOT = Path(__file__).resolve().parents[3]
# Opens argv[1] as argv[2] says ("rdwr", "map": mapped writable and shared, its descriptor closed, or "read"),
# says "ready", and holds it until its stdin closes.
HOLDER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY if sys.argv[2] == "read" else os.O_RDWR)
if sys.argv[2] == "map":
    held = mmap.mmap(fd, 0, mmap.MAP_SHARED)
    os.close(fd)
print("ready", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def file(tmp_path: Path) -> Iterator[int]:
    path = tmp_path / "model.safetensors"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDONLY)
    yield fd
    os.close(fd)


def held(path: str, how: str, namespace: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [*namespace, sys.executable, "-c", HOLDER, path, how], text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.parametrize(("how", "writing"), [("read", False), ("rdwr", True), ("map", True)])
@pytest.mark.parametrize("namespace", [[], ["unshare", "--pid", "--fork", "--mount-proc"]], ids=["here", "pid-ns"])
def test_a_writer_anywhere_is_seen_and_a_reader_is_not(
    file: int, how: str, writing: bool, namespace: list[str]
) -> None:
    path = os.readlink(f"/proc/self/fd/{file}")
    assert open_for_writing(file) is False
    with held(path, how, namespace) as holder:
        assert open_for_writing(file) is writing
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert open_for_writing(file) is False  # and the probe held no lease after itself


def test_without_the_right_to_a_lease_it_says_it_cannot_tell(tmp_path: Path) -> None:
    """A file of another uid, asked by root without CAP_LEASE (as a container's root is): None."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to own the file as another uid and drop CAP_LEASE")
    path = tmp_path / "theirs"
    path.write_bytes(bytes(4096))
    os.chown(path, 54_321, 54_321)
    code = "import os, sys; from engram.runtime.checkpoints.files import open_for_writing; print(open_for_writing(os.open(sys.argv[1], os.O_RDONLY)))"
    done = subprocess.run(
        ["setpriv", "--bounding-set=-lease", "--inh-caps=-lease", sys.executable, "-c", code, str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0 and "setpriv" in done.stderr:
        pytest.skip(f"cannot drop a capability here: {done.stderr.strip()}")
    assert done.stdout == "None\n", done.stderr
