"""A user's own text as a stream of token ids, in order: plain text files, or JSON Lines whose objects
carry the text in a `prompt` or `text` field (`.jsonl`/`.ndjson`, or any file whose first line is such
an object), tokenized with the model's tokenizer. Bounded: at most `max_tokens` tokens in all, lines of
JSON at most MAX_LINE bytes, plain text read in chunks of CHUNK_BYTES and tokenized as the whole text is
(_plain_ids)."""

from __future__ import annotations

import codecs
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


CARRY_CHARS = 256  # text tokenized again with the next chunk, at least: past any added token, any look-ahead
MAX_CARRY = 4 * CHUNK_BYTES  # text with no cut the tokenizer allows, at most


def _plain_ids(path: Path, f: object, tokenizer: Tokenizer) -> Iterator[np.ndarray]:
    """A plain text file's token ids, in order, as tokenizer.encode of the whole text gives them. Read
    CHUNK_BYTES at a time through an incremental UTF-8 decoder (a character a read splits stays whole),
    each chunk's ids are given up to a cut no token can span: a boundary between two of the tokenizer's
    words (its pre-tokenizer's pieces, within which alone tokens are made), where the tokens' offsets
    meet, at least CARRY_CHARS before the text read so far ends (so nothing after it can change how the
    text before it splits). The text after the cut is tokenized again with the next chunk."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    carry = ""
    while True:
        block = f.read(CHUNK_BYTES)  # type: ignore[attr-defined]
        text = carry + decoder.decode(block, final=not block)
        if not block:
            if text:
                yield np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
            return
        encoding = tokenizer.encode(text, add_special_tokens=False)
        cut = _cut(encoding.offsets, encoding.word_ids, len(text) - CARRY_CHARS)
        if cut is None:
            if len(text) > MAX_CARRY:
                raise EngramError(
                    f"{path}: {len(text):,} characters in a row hold no place the tokenizer lets a chunk be cut "
                    "(one word of its, or a run it keeps whole); split the text"
                )
            carry = text
            continue
        yield np.asarray(encoding.ids[:cut], dtype=np.int64)
        carry = text[encoding.offsets[cut][0] :]


def _cut(offsets: list[tuple[int, int]], words: list[int | None], before: int) -> int | None:
    """The last token that starts a word of the tokenizer's at character `before` or earlier, right where
    the token before it ends; None where there is none."""
    for at in range(len(offsets) - 1, 0, -1):
        start = offsets[at][0]
        if start > before:
            continue
        if start <= 0:
            return None
        new_word = words[at] is None or words[at] != words[at - 1]
        if new_word and offsets[at - 1][1] == start:
            return at
    return None


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
            chunks: Iterator[np.ndarray]
            if _is_json_lines(path, head):
                chunks = (
                    np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
                    for text in _json_texts(path, f)
                )
            else:
                chunks = _plain_ids(path, f, tokenizer)
            for ids in chunks:
                if total >= max_tokens:
                    break
                ids = ids[: max_tokens - total]
                parts.append(ids)
                count += ids.size
                total += ids.size
        files.append((name, count))
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    return Traffic(torch.from_numpy(tokens), files)
