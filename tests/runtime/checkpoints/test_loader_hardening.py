"""Checkpoints that are corrupt, hostile or changing underneath: a clear one-line error naming the file,
never a signal, a hang or a silently different table."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engram.cli import main
from engram.errors import EngramError
from engram.runtime.checkpoints.loader import Checkpoint, load_shards
from engram.runtime.placement.storage import allocate
from engram.runtime.shard import ShardFormat


def raw_safetensors(path: Path, header: bytes, data: bytes) -> Path:
    path.write_bytes(len(header).to_bytes(8, "little") + header + data)
    return path


def test_overlapping_tensors_are_refused(tmp_path: Path) -> None:
    """Two tensors over the same bytes load as each other: refused, as the safetensors library does."""
    header = (
        b'{"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},'
        b' "b.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}'
    )
    path = raw_safetensors(tmp_path / "m.safetensors", header, bytes(24))
    with pytest.raises(
        EngramError, match=r"tensor 'b.weight' at data_offsets \[8, 24\] overlaps the tensor before it: invalid offsets"
    ):
        Checkpoint(path)
    gap = b'{"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [4, 20]}}'
    with pytest.raises(EngramError, match=r"leaves bytes 0..4 unclaimed: invalid offsets"):
        Checkpoint(raw_safetensors(path, gap, bytes(20)))
    trailing = b'{"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}'
    with pytest.raises(
        EngramError, match=r"the tensors end at data byte 16 but the data region holds 20: invalid offsets"
    ):
        Checkpoint(raw_safetensors(path, trailing, bytes(20)))


def test_a_header_nested_deep(tmp_path: Path) -> None:
    header = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(EngramError, match=r"m.safetensors: header (nests too deeply|is not valid JSON)"):
        Checkpoint(raw_safetensors(tmp_path / "m.safetensors", header, b""))


def test_a_file_that_shrinks_after_opening_is_an_error_not_sigbus(tmp_path: Path) -> None:
    """In a child process, so a SIGBUS would be observed (exit -7) rather than suffered."""
    weight = torch.arange(4096 * 64, dtype=torch.float32).view(4096, 64)
    save_file({"t.weight": weight}, str(tmp_path / "m.safetensors"))
    script = textwrap.dedent(
        f"""
        import os, sys
        from engram.errors import EngramError
        from engram.runtime.checkpoints.loader import Checkpoint
        checkpoint = Checkpoint({str(tmp_path)!r})
        os.truncate({str(tmp_path / "m.safetensors")!r}, 4096)
        for read in (lambda: checkpoint.sources["t.weight"](), lambda: checkpoint.files["t.weight"].tensor("t.weight")):
            try:
                read()
                print("read a shrunk file")
            except EngramError as exc:
                print(exc)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(
        line.endswith("the file changed since it was opened (replaced, truncated or rewritten); load again")
        for line in lines
    )


def test_a_file_shrinking_during_a_read(tmp_path: Path) -> None:
    """Same size and identity at open, then fewer bytes while reading (the identity check cannot see a
    change within one timestamp): the read stops with a clear error."""
    weight = torch.arange(100 * 32, dtype=torch.float32).view(100, 32)
    save_file({"t.weight": weight}, str(tmp_path / "m.safetensors"))
    checkpoint = Checkpoint(tmp_path)
    source = checkpoint.files["t.weight"]
    stat = os.stat(tmp_path / "m.safetensors")
    os.truncate(tmp_path / "m.safetensors", stat.st_size - 100)
    os.utime(tmp_path / "m.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns))
    source.identity = (*source.identity[:2], stat.st_size - 100, stat.st_mtime_ns)  # as if nothing changed
    with pytest.raises(EngramError, match=r"tensor 't\.weight' ended early: the file shrank while loading"):
        source.tensor("t.weight")


def rewrite_pt(path: Path, out: Path, change: dict[str, bytes | None]) -> Path:
    """Copy a .pt zip record by record, replacing the records named in `change` (by suffix)."""
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info.filename)
            for suffix, replacement in change.items():
                if info.filename.endswith(suffix) and replacement is not None:
                    data = replacement
            target.writestr(info, data)
    return out


@pytest.mark.parametrize("keep", [100, 0])
def test_a_pt_record_shorter_than_its_tensor(tmp_path: Path, keep: int) -> None:
    """torch.load(mmap=True) takes the size from the pickle: without the check this loads other bytes."""
    torch.save({"t.weight": torch.arange(64, dtype=torch.float32).view(8, 8)}, tmp_path / "a.pt")
    with zipfile.ZipFile(tmp_path / "a.pt") as z:
        record = next(n for n in z.namelist() if n.endswith("/data/0"))
        data = z.read(record)
    short = rewrite_pt(tmp_path / "a.pt", tmp_path / "short.pt", {"/data/0": data[:keep]})
    with pytest.raises(
        EngramError,
        match=r"short.pt: the tensors' storages \(1, 256 bytes\) do not match the data records \(1, "
        + f"{keep} bytes"
        + r"\): the file is corrupt",
    ):
        Checkpoint(short)


def test_a_flipped_byte_in_a_pt_is_caught_by_its_crc(tmp_path: Path) -> None:
    torch.save({"t.weight": torch.arange(64, dtype=torch.float32).view(8, 8)}, tmp_path / "a.pt")
    raw = bytearray((tmp_path / "a.pt").read_bytes())
    with zipfile.ZipFile(tmp_path / "a.pt") as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/data/0"))
    start = raw.index(bytes(torch.arange(64, dtype=torch.float32).numpy().tobytes()[:16]), info.header_offset)
    raw[start + 40] ^= 0x01
    (tmp_path / "flipped.pt").write_bytes(bytes(raw))
    with pytest.raises(EngramError, match=r"flipped.pt: record '.*data/0' fails its CRC-32 check: the file is corrupt"):
        Checkpoint(tmp_path / "flipped.pt")


@pytest.mark.parametrize("kind", ["meta", "sparse"])
def test_pt_tensors_that_hold_no_rows(tmp_path: Path, kind: str) -> None:
    tensor = torch.empty(4, 4, device="meta") if kind == "meta" else torch.eye(4).to_sparse()
    torch.save({"t.weight": tensor}, tmp_path / "odd.pt")
    with pytest.raises(EngramError, match=r"odd.pt: (tensor 't.weight' is|not a readable .pt checkpoint)"):
        Checkpoint(tmp_path / "odd.pt")


def test_what_is_not_a_regular_file(tmp_path: Path) -> None:
    (tmp_path / "dangling.safetensors").symlink_to(tmp_path / "gone")
    with pytest.raises(
        EngramError, match=r"dangling.safetensors cannot be read: No such file or directory \(a dangling link\?\)"
    ):
        Checkpoint(tmp_path)
    with pytest.raises(EngramError, match=r"dangling.safetensors cannot be read"):
        Checkpoint(tmp_path / "dangling.safetensors")
    os.unlink(tmp_path / "dangling.safetensors")
    (tmp_path / "model.safetensors").mkdir()
    with pytest.raises(EngramError, match=r"model.safetensors is a directory; it must be a regular file"):
        Checkpoint(tmp_path)
    os.rmdir(tmp_path / "model.safetensors")
    os.mkfifo(tmp_path / "model.safetensors")  # opening it would block forever
    with pytest.raises(EngramError, match=r"model.safetensors is a FIFO; it must be a regular file"):
        Checkpoint(tmp_path)


def test_loading_reads_rows_from_the_file_into_every_placement(tmp_path: Path) -> None:
    weight = torch.arange(50 * 32, dtype=torch.float32).view(50, 32)
    save_file({"t.weight": weight}, str(tmp_path / "m.safetensors"))
    for placement in ("host", "device"):  # device on this machine: a plain tensor, read through staging
        shard = allocate("t", ShardFormat(20, 32, "fp32"), placement, row_start=10)  # type: ignore[arg-type]
        assert load_shards([shard], {"t": 50}, Checkpoint(tmp_path), progress=False) == 20 * 32 * 4
        assert torch.equal(shard.weight, weight[10:30])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--out", "/proc/engram-checkpoint"],
            "cannot write into the checkpoint directory /proc/engram-checkpoint: No such file or directory; choose another",
        ),
        (["--seed", str(1 << 64)], "--seed must be between 0 and 2**63 - 1"),
        (["--seed", "-1"], "--seed must be between 0 and 2**63 - 1"),
    ],
)
def test_make_checkpoint_mistakes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    full = ["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path / "out"), *argv]
    assert main(full) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_make_checkpoint_under_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path / "file" / "ckpt")]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"error: cannot write into the checkpoint directory {tmp_path / 'file' / 'ckpt'}: Not a directory; choose another\n"
    )


def test_opt_in_sha256_verification(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """safetensors has no checksum: a flipped data byte passes the structural checks and only the
    SHA256SUMS manifest (written by make-checkpoint, or by sha256sum) catches it."""
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path)]) == 0
    manifest = (tmp_path / "SHA256SUMS").read_text()
    assert manifest.endswith("  model.safetensors\n") and len(manifest.split()[0]) == 64
    capsys.readouterr()
    assert main(["check-checkpoint", str(tmp_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: 4 tensors in 1 file(s), sha256 verified against SHA256SUMS\n")
    assert "  layers.1.engram.embed.weight: [10170, 32] float8_e4m3fn\n" in out
    data = bytearray((tmp_path / "model.safetensors").read_bytes())
    data[-10] ^= 0x40
    (tmp_path / "model.safetensors").write_bytes(bytes(data))
    assert main(["check-checkpoint", str(tmp_path)]) == 0  # structurally fine: undetectable without a digest
    capsys.readouterr()
    assert main(["check-checkpoint", str(tmp_path), "--verify"]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'model.safetensors'}: sha256 differs from {tmp_path / 'SHA256SUMS'}: the file changed or is corrupt\n"
    )
    (tmp_path / "SHA256SUMS").unlink()
    with pytest.raises(EngramError, match=r"no SHA256SUMS there; write one with `sha256sum \* > SHA256SUMS`"):
        Checkpoint(tmp_path, verify=True)
    (tmp_path / "SHA256SUMS").write_text("not a digest line\n")
    with pytest.raises(EngramError, match=r"SHA256SUMS:1: not a '<sha256>  <file>' line"):
        Checkpoint(tmp_path, verify=True)


def test_a_header_whose_dtype_is_not_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    header = b'{"a.weight": {"dtype": ["F32"], "shape": [2, 2], "data_offsets": [0, 16]}}'
    path = raw_safetensors(tmp_path / "m.safetensors", header, bytes(16))
    assert main(["check-checkpoint", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}: tensor 'a.weight': unsupported dtype ['F32']\n"


@pytest.mark.parametrize("manifest", ["binary", "fifo", "directory", "huge"])
def test_a_manifest_that_is_no_text_file_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], manifest: str
) -> None:
    assert main(["make-checkpoint", "--preset", "tiny", "--out", str(tmp_path)]) == 0
    path = tmp_path / "SHA256SUMS"
    path.unlink()
    expected = {
        "binary": f"the manifest {path} is not UTF-8 text (byte 0); write it again",
        "fifo": f"the manifest {path} is a FIFO; it must be a regular file",
        "directory": f"the manifest {path} is a directory; it must be a regular file",
        "huge": f"the manifest {path} is larger than 1,048,576 bytes; it cannot be the file engram expects",
    }[manifest]
    if manifest == "binary":
        path.write_bytes(b"\xff\xfe digest")
    elif manifest == "fifo":
        os.mkfifo(path)  # reading it would wait for a writer forever
    elif manifest == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"0" * ((1 << 20) + 1))
    capsys.readouterr()
    assert main(["check-checkpoint", str(tmp_path), "--verify"]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"


def test_a_safetensors_file_named_otherwise_is_read_as_safetensors(tmp_path: Path) -> None:
    weights = {"a.weight": torch.arange(12, dtype=torch.float32).view(3, 4)}
    save_file(weights, str(tmp_path / "model.weights"))
    checkpoint = Checkpoint(tmp_path / "model.weights")
    assert torch.equal(checkpoint.sources["a.weight"](), weights["a.weight"])
    assert set(checkpoint.files) == {"a.weight"}  # read in place, as any safetensors file
    torch.save(weights, tmp_path / "model.ckpt")
    assert torch.equal(Checkpoint(tmp_path / "model.ckpt").sources["a.weight"](), weights["a.weight"])


def _sha256sum_accepts(directory: Path) -> bool:
    """The oracle: GNU `sha256sum -c` on the same manifest."""
    done = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=directory, capture_output=True, timeout=60)
    return done.returncode == 0


@pytest.mark.parametrize(
    "lines",
    [
        ["{bad}  model.safetensors", "{good}  model.safetensors"],  # listed twice, the wrong digest first
        ["{good}  model.safetensors", "{bad}  model.safetensors"],
        ["{good}  ./model.safetensors"],  # the same file, named from its directory
        ["{good} *model.safetensors"],  # binary mode
        ["{good}  model.safetensors", "{good}  ./model.safetensors"],
        ["{bad}  ./model.safetensors"],
    ],
)
def test_verify_agrees_with_sha256sum(tmp_path: Path, lines: list[str]) -> None:
    save_file({"t.weight": torch.ones(4, 8)}, str(tmp_path / "model.safetensors"))
    good = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    text = "".join(line.format(good=good, bad="0" * 64) + "\n" for line in lines)
    (tmp_path / "SHA256SUMS").write_text(text)
    try:
        Checkpoint(tmp_path, verify=True)
        verified = True
    except EngramError:
        verified = False
    assert verified == _sha256sum_accepts(tmp_path)


def test_a_dangling_manifest_link_is_named_as_such(tmp_path: Path) -> None:
    save_file({"t.weight": torch.ones(4, 8)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "SHA256SUMS").symlink_to(tmp_path / "gone")
    with pytest.raises(EngramError, match=r"SHA256SUMS cannot be read: No such file or directory"):
        Checkpoint(tmp_path, verify=True)


def test_a_bogus_header_fails_before_any_byte_is_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from engram.runtime.checkpoints import digests

    path = tmp_path / "model.safetensors"
    with path.open("wb") as f:  # a sparse file of 1 GiB whose header claims more than it holds
        f.write((100).to_bytes(8, "little") + b"{" + b" " * 99)
        f.truncate(1 << 30)
    (tmp_path / "SHA256SUMS").write_text(f"{'0' * 64}  model.safetensors\n")
    hashed: list[Path] = []
    monkeypatch.setattr(digests, "file_digest", lambda p: hashed.append(p) or "0" * 64)
    with pytest.raises(EngramError, match="header"):
        Checkpoint(tmp_path, verify=True)
    assert hashed == []


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (
            ["t.shard_0", "t.shard_1", "t.shard_01"],
            "'t.shard_01.weight' and 't.shard_1.weight' both name part 1 of t.weight; keep one",
        ),
        (
            ["t.shard_0", "t.shard_\u00b2"],
            "'t.shard_\\xb2.weight' is not a part name: parts are t.shard_<k>.weight with k in ASCII digits",
        ),
    ],
)
def test_ambiguous_or_foreign_part_names_are_refused(tmp_path: Path, names: list[str], message: str) -> None:
    tensors = {f"{name}.weight": torch.ones(5, 32, dtype=torch.bfloat16) for name in names}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    [shard] = [allocate("t", ShardFormat(10, 32, "bf16"), "host")]
    with pytest.raises(EngramError, match=re.escape(message)):
        load_shards([shard], {"t": 10}, Checkpoint(tmp_path), progress=False)


def test_tensor_names_reach_the_terminal_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    names = ["a\x1b[2Jb", "line\nok: 0 tensors", "\u202eedoc", "tab\there"]
    save_file({name: torch.ones(1) for name in names}, str(tmp_path / "m.safetensors"))
    assert main(["check-checkpoint", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "ok: 4 tensors in 1 file(s)",
        "  a\\x1b[2Jb: [1] float32",
        "  line\\nok: 0 tensors: [1] float32",
        "  tab\\there: [1] float32",
        "  \\u202eedoc: [1] float32",
    ]
