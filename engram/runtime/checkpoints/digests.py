"""An opt-in integrity check of checkpoint files against a SHA256SUMS manifest (the `sha256sum` format:
"<hex digest>  <file name>" per line), beside the files.

What each format detects on its own: safetensors has no checksum, so engram checks its structure (header,
shapes, dtypes, byte ranges tiling the data) but a flipped byte inside the data loads as a different
value; .pt files carry a CRC-32 per zip record, which engram always checks, so random corruption is
caught, though a deliberate edit can fix up its CRC. A SHA256SUMS manifest, checked with verify=True or
`engram check-checkpoint --verify`, catches any change to any file of either format."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from engram.errors import EngramError
from engram.output_files import write_output
from engram.runtime.checkpoints.files import open_regular, read_text

MANIFEST = "SHA256SUMS"
MANIFEST_LIMIT = 1 << 20  # 1 MiB: about 10,000 files of a checkpoint
CHUNK = 16 << 20


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with os.fdopen(open_regular(path, "checkpoint file"), "rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
    except OSError as exc:
        raise EngramError(f"checkpoint file {path} cannot be read: {exc.strerror}") from None
    return digest.hexdigest()


def manifest_text(files: Iterable[Path]) -> str:
    """SHA256SUMS's text for `files` (all in one directory), in the format `sha256sum -c` reads."""
    return "".join(f"{file_digest(f)}  {f.name}\n" for f in sorted(files, key=lambda f: f.name))


def write_manifest(directory: Path, files: Iterable[Path]) -> Path:
    """SHA256SUMS for `files` (all in `directory`), written as engram writes every file (output_files)."""
    target = directory / MANIFEST
    write_output(MANIFEST, target, manifest_text(files).encode())
    return target


def _unescape(name: str) -> str | None:
    """A name as sha256sum escapes it (a line starting with a backslash: \\\\ and \\n), or None."""
    out, i = [], 0
    while i < len(name):
        if name[i] != "\\":
            out.append(name[i])
        elif name[i + 1 : i + 2] in ("\\", "n"):
            out.append("\\" if name[i + 1] == "\\" else "\n")
            i += 1
        else:
            return None
        i += 1
    return "".join(out)


def _entry(line: str) -> tuple[str, str] | None:
    """(file name, digest) of one line as `sha256sum -c` reads it: "<hex>  <name>" or "<hex> *<name>",
    escaped when it starts with a backslash, a leading "./" meaning the same file; None if malformed."""
    escaped = line.startswith("\\")
    line = line[1:] if escaped else line
    digest, sep, mode, name = line[:64], line[64:65], line[65:66], line[66:]
    if len(digest) != 64 or sep != " " or mode not in (" ", "*") or not name:
        return None
    if any(c not in "0123456789abcdef" for c in digest.lower()):
        return None
    unescaped = _unescape(name) if escaped else name
    if unescaped is None:
        return None
    while unescaped.startswith("./"):
        unescaped = unescaped[2:]
    return unescaped, digest.lower()


def read_manifest(directory: Path) -> dict[str, set[str]]:
    """Every digest SHA256SUMS lists for each file name (a name listed twice must match both times, as
    `sha256sum -c` checks every line)."""
    path = directory / MANIFEST
    if not path.exists() and not path.is_symlink():
        raise EngramError(f"cannot verify {directory}: no {MANIFEST} there; write one with `sha256sum * > {MANIFEST}`")
    text = read_text(path, "the manifest", MANIFEST_LIMIT)
    entries: dict[str, set[str]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        entry = _entry(line)
        if entry is None:
            raise EngramError(f"{path}:{number}: not a '<sha256>  <file>' line")
        entries.setdefault(entry[0], set()).add(entry[1])
    return entries


def verify_files(directory: Path, files: Iterable[Path]) -> None:
    """Every file's sha256 against the manifest; any difference, or a file it does not list, is an error."""
    manifest = read_manifest(directory)
    for file in sorted(files):
        if file.name not in manifest:
            raise EngramError(f"{file}: not listed in {directory / MANIFEST}; cannot verify it")
        listed = manifest[file.name]
        if len(listed) > 1:
            raise EngramError(
                f"{file}: {directory / MANIFEST} lists {len(listed)} different digests for it; at most one is right"
            )
        if file_digest(file) not in listed:
            raise EngramError(f"{file}: sha256 differs from {directory / MANIFEST}: the file changed or is corrupt")
