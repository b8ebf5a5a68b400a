"""The real-text corpus: built offline from the standard library and man pages, tokenized with the real
DeepSeek V4 tokenizer, split by file into a fit part and a held-out part, cached; and its row ids."""

from __future__ import annotations

import hashlib

import pytest
import torch

from engram.apps import corpus
from engram.apps.presets import get_preset, scaled_preset
from engram.errors import EngramError
from engram.ops import use_sorted


@pytest.mark.slow
def test_corpus_is_real_text_of_a_million_tokens_and_more() -> None:
    built = corpus.load_corpus()
    assert built.tokens.dtype == torch.int64 and built.tokens.numel() >= 1_000_000
    assert sum(built.sources.values()) == built.tokens.numel()
    assert built.sources["code"] > 500_000 and built.sources["prose"] > 100_000
    assert 0.1 < built.held_out.numel() / built.tokens.numel() < 0.35  # about one file in five
    assert built.fit.numel() + built.held_out.numel() == built.tokens.numel()
    again = corpus.load_corpus()  # from the cache: the same tokens
    assert torch.equal(again.tokens, built.tokens) and again.held_out_from == built.held_out_from
    assert int(built.tokens.max()) < 129_280 and int(built.tokens.min()) >= 0


def test_documents_and_split() -> None:
    docs = corpus.documents()
    kinds = {kind for kind, _, _ in docs}
    assert {"code", "prose"} <= kinds
    code = next(text for kind, path, text in docs if kind == "code" and path.name == "textwrap.py")
    prose = next(text for kind, path, text in docs if kind == "prose" and path.name == "textwrap.py")
    assert "def wrap(" in code and "def wrap(" not in prose and "Wrap" in prose
    held = [corpus._held_out(p) for _, p, _ in docs]  # by a hash of the path: the same on every machine
    assert held == [hashlib.sha256(str(p).encode()).digest()[0] < 52 for _, p, _ in docs]
    assert 0.1 < sum(held) / len(held) < 0.3
    assert corpus.ROFF_REQUEST.sub("", ".TH LS 1\nlist directory contents\n.SH NAME") == "\nlist directory contents\n"


def test_text_rows_are_the_real_hash_of_the_stream() -> None:
    spec = get_preset("tiny")
    tokens = torch.arange(100, 160)
    batches = corpus.text_rows(spec, tokens, 20, 3)
    assert [b.shape for b in batches] == [(20, 2, spec.layout.columns)] * 3
    assert torch.equal(torch.cat(batches), spec.hasher().hash(spec.compress(tokens)))
    with pytest.raises(EngramError, match="the corpus has 60 tokens; 4 batches of 20 need 80"):
        corpus.text_rows(spec, tokens, 20, 4)


def test_scaled_preset_keeps_the_row_format() -> None:
    spec = scaled_preset("deepseek-v4.1-flash", 4 << 30)
    base = get_preset("deepseek-v4.1-flash")
    assert abs(spec.table_bytes - (4 << 30)) < 0.01 * (4 << 30)
    assert (spec.head_dim, spec.dtype, spec.layout.columns, spec.layer_ids) == (
        base.head_dim, base.dtype, base.layout.columns, base.layer_ids,
    )  # fmt: skip
    with pytest.raises(EngramError, match="only DeepSeek-family presets scale; 'qwen4-exp-ple' is qwen"):
        scaled_preset("qwen4-exp-ple", 1 << 30)


def test_when_the_sorted_form_is_used() -> None:
    host = torch.empty(10, 32)
    assert not use_sorted(1 << 20, host, torch.device("cpu"))  # the CPU: measured not to pay
    assert not use_sorted(1 << 20, torch.empty(10, 32, device="meta"), torch.device("meta"))  # device tables
    assert use_sorted(4096, host, torch.device("cuda")) and not use_sorted(4095, host, torch.device("cuda"))
