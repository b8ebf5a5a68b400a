"""The user's cache (engram.user_cache): a truncated or corrupt entry is rebuilt, not fatal, and an entry
or directory another user could write is never read."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from engram.apps import corpus
from engram.ngram import vocab
from engram.ngram.vocab import deepseek_v4_tokenizer, deepseek_v4_tokenizer_file
from engram.user_cache import cache_root, cache_subdir, read_cached
from tests.other_user import OtherUser


def test_a_truncated_vocabulary_cache_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(tmp_path))
    vocab.compressed_lookup.cache_clear()
    built = vocab.compressed_lookup(deepseek_v4_tokenizer_file()).clone()
    [entry] = list((tmp_path / "vocab").iterdir())
    whole = entry.read_bytes()
    entry.write_bytes(whole[: len(whole) // 2])
    vocab.compressed_lookup.cache_clear()
    try:
        assert torch.equal(vocab.compressed_lookup(deepseek_v4_tokenizer_file()), built)
    finally:
        vocab.compressed_lookup.cache_clear()
    assert entry.read_bytes() == whole  # written again, whole


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 not a zip", b"\x93NUMPY garbage"])
def test_a_corrupt_corpus_cache_is_rebuilt(damage: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(tmp_path))
    text = "def lookup(rows):\n    return rows[ids]\n"
    monkeypatch.setattr(corpus, "documents", lambda: [("code", Path("a.py"), text)])
    corpus._cache_path().write_bytes(damage)
    loaded = corpus.load_corpus()
    expected = deepseek_v4_tokenizer().encode(text, add_special_tokens=False).ids  # the tokenizer itself
    assert loaded.tokens.tolist() == expected and loaded.sources == {"code": len(expected)}
    assert corpus.load_corpus().tokens.tolist() == expected  # and the rebuilt entry reads back


def test_an_entry_of_another_user_is_not_read(other_user: OtherUser, tmp_path: Path) -> None:
    directory = tmp_path / "entries"
    directory.mkdir()
    entry = directory / "x.npy"
    np.save(entry, np.arange(4))
    assert read_cached(entry, np.load).tolist() == [0, 1, 2, 3]  # type: ignore[union-attr]
    os.chown(entry, other_user.uid, other_user.gid)
    assert read_cached(entry, np.load) is None and entry.exists()  # not ours: neither read nor removed


def test_a_shared_cache_root_gets_a_private_directory(
    open_directory: Callable[[int], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = open_directory(0o1777)
    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(shared))
    assert cache_root() == shared / f"user-{os.geteuid()}"
    assert cache_subdir("build").stat().st_mode & 0o777 == 0o700
