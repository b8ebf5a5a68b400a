"""A user's own text as a stream of token ids, in order: plain text files, or JSON Lines whose objects
carry the text in a `prompt` or `text` field (`.jsonl`/`.ndjson`, or any file whose first line is such
an object), tokenized with the model's tokenizer. Bounded: at most `max_tokens` tokens in all, lines of
JSON at most MAX_LINE bytes, text read in chunks of CHUNK_BYTES."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.ngram.vocab import deepseek_v4_tokenizer
from engram.runtime.checkpoints.files import check_regular, open_regular

MAX_LINE = 16 << 20
CHUNK_BYTES = 1 << 20
JSON_SUFFIXES = (".jsonl", ".ndjson")
FIELDS = ("prompt", "text")


@dataclass(frozen=True)
class Traffic:
    """Token ids of the files in order (int64), and each file's path and token count."""

    tokens: torch.Tensor
    files: list[tuple[str, int]]


def tokenizer_for(spec: ModelSpec, path: str | None) -> Tokenizer:
    """The model's tokenizer: `path` (a tokenizer.json) when given, else the one bundled for the preset."""
    if path is not None:
        check_regular(Path(path), "the tokenizer")
        try:
            return Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises its own exception type, with a message
            raise EngramError(f"cannot read the tokenizer {path}: {str(exc)[:200]}; give a tokenizer.json") from None
    if spec.tokenizer == "deepseek-v4":
        return deepseek_v4_tokenizer()
    raise EngramError(f"{spec.name}'s tokenizer is not bundled: pass --tokenizer FILE (the model's tokenizer.json)")


def _is_json_lines(path: Path, head: bytes) -> bool:
    if path.suffix.lower() in JSON_SUFFIXES:
        return True
    first = head.split(b"\n", 1)[0].strip()
    if not first.startswith(b"{"):
        return False
    try:
        found = json.loads(first)
    except (ValueError, RecursionError):
        return False
    return isinstance(found, dict) and any(isinstance(found.get(k), str) for k in FIELDS)


def _json_texts(path: Path, f: object) -> Iterator[str]:
    for number, line in enumerate(_lines(path, f), start=1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)
        except (ValueError, RecursionError):
            found = None
        if not isinstance(found, dict):
            raise EngramError(f"{path}:{number}: not a JSON object; JSON Lines hold one object a line")
        text = next((found[k] for k in FIELDS if isinstance(found.get(k), str)), None)
        if text is None:
            raise EngramError(f"{path}:{number}: the object has no string field 'prompt' or 'text'")
        yield text


def _lines(path: Path, f: object) -> Iterator[bytes]:
    while True:
        line = f.readline(MAX_LINE + 1)  # type: ignore[attr-defined]
        if not line:
            return
        if len(line) > MAX_LINE:
            raise EngramError(f"{path}: a line is longer than {MAX_LINE >> 20} MiB; split it")
        yield line


def _plain_texts(f: object) -> Iterator[str]:
    """Chunks of about CHUNK_BYTES, cut after a newline where there is one (a token never spans a cut)."""
    rest = b""
    while True:
        block = f.read(CHUNK_BYTES)  # type: ignore[attr-defined]
        if not block:
            break
        block = rest + block
        cut = block.rfind(b"\n") + 1 or len(block)
        rest = block[cut:]
        yield block[:cut].decode("utf-8", "replace")
    if rest:
        yield rest.decode("utf-8", "replace")


def read_traffic(paths: list[str], tokenizer: Tokenizer, max_tokens: int) -> Traffic:
    """The token ids of `paths`, in order, at most `max_tokens` of them."""
    parts: list[np.ndarray] = []
    files: list[tuple[str, int]] = []
    total = 0
    for name in paths:
        path = Path(name)
        count = 0
        with os.fdopen(open_regular(path, "the text file"), "rb") as f:
            head = f.peek(4096)[:4096]
            texts = _json_texts(path, f) if _is_json_lines(path, head) else _plain_texts(f)
            for text in texts:
                if total >= max_tokens:
                    break
                ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
                ids = ids[: max_tokens - total]
                parts.append(ids)
                count += ids.size
                total += ids.size
        files.append((name, count))
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return Traffic(torch.from_numpy(tokens), files)
