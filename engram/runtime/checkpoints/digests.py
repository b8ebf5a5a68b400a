"""An opt-in integrity check of checkpoint files against a SHA256SUMS manifest (the `sha256sum` format:
"<hex digest>  <file name>" per line), beside the files.

What each format detects on its own: safetensors has no checksum, so engram checks its structure (header,
shapes, dtypes, byte ranges tiling the data) but a flipped byte inside the data loads as a different
value; .pt files carry a CRC-32 per zip record, which engram always checks, so random corruption is
caught, though a deliberate edit can fix up its CRC. A SHA256SUMS manifest, checked with verify=True or
`engram check-checkpoint --verify`, catches any change to any file of either format."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from engram.errors import EngramError
from engram.runtime.checkpoints.files import read_text

MANIFEST = "SHA256SUMS"
MANIFEST_LIMIT = 1 << 20  # 1 MiB: about 10,000 files of a checkpoint
CHUNK = 16 << 20


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, files: Iterable[Path]) -> Path:
    """SHA256SUMS for `files` (all in `directory`), in the format `sha256sum -c` reads."""
    lines = [f"{file_digest(f)}  {f.name}\n" for f in sorted(files)]
    target = directory / MANIFEST
    target.write_text("".join(lines))
    return target


def read_manifest(directory: Path) -> dict[str, str]:
    path = directory / MANIFEST
    if not path.exists():
        raise EngramError(f"cannot verify {directory}: no {MANIFEST} there; write one with `sha256sum * > {MANIFEST}`")
    text = read_text(path, "the manifest", MANIFEST_LIMIT)
    entries = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, _, name = line.partition("  ")
        name = name.lstrip("*")
        if len(digest) != 64 or not name or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise EngramError(f"{path}:{number}: not a '<sha256>  <file>' line")
        entries[name] = digest.lower()
    return entries


def verify_files(directory: Path, files: Iterable[Path]) -> None:
    """Every file's sha256 against the manifest; any difference, or a file it does not list, is an error."""
    manifest = read_manifest(directory)
    for file in sorted(files):
        if file.name not in manifest:
            raise EngramError(f"{file}: not listed in {directory / MANIFEST}; cannot verify it")
        if file_digest(file) != manifest[file.name]:
            raise EngramError(f"{file}: sha256 differs from {directory / MANIFEST}: the file changed or is corrupt")
