"""A plain text file's token ids, read a chunk at a time, are exactly what the tokenizer gives the whole
text (tokenizer.encode of the file decoded at once, the independent oracle): whatever a read's cut
splits (a line longer than a chunk, a multi-byte character, a run of newlines the tokenizer takes as one
token, a run of digits, bytes that are not UTF-8), and text with no place to cut is refused, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.apps import traffic
from engram.apps.traffic import CHUNK_BYTES, read_traffic
from engram.errors import EngramError
from engram.ngram.vocab import deepseek_v4_tokenizer

TOKENIZER = deepseek_v4_tokenizer()
PIECES = ["\n", "\n\n", " ", "  ", "\t", "\r\n", "word", "Wörter", "中文字", "ひらがな", "😀", "12345", ",", "...", "é"]


def whole(data: bytes) -> list[int]:
    return list(TOKENIZER.encode(data.decode("utf-8", "replace"), add_special_tokens=False).ids)


def read(path: Path) -> list[int]:
    return read_traffic([str(path)], TOKENIZER, 1 << 40).tokens.tolist()


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.sampled_from(PIECES), min_size=0, max_size=400),
    junk=st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=3)), max_size=3),
    chunk=st.sampled_from([1, 7, 64, 300, 1000]),
)
def test_chunked_ids_are_the_whole_texts(
    tmp_path_factory: pytest.TempPathFactory, pieces: list[str], junk: list[tuple[int, bytes]], chunk: int
) -> None:
    data = "".join(pieces).encode()
    for at, raw in junk:  # bytes that are not UTF-8, anywhere
        data = data[:at] + raw + data[at:]
    path = tmp_path_factory.mktemp("text") / "traffic.txt"
    path.write_bytes(data)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(traffic, "CHUNK_BYTES", chunk)
        assert read(path) == whole(data)


def test_the_default_chunks_cut_no_token_of_a_long_line_or_a_newline_run(tmp_path: Path) -> None:
    """At CHUNK_BYTES itself: a line longer than a chunk with a 3-byte character across the first cut,
    then "\\n\\n" (one DeepSeek token, 271) across the second."""
    line = ("lorem ipsum dolor " * (CHUNK_BYTES // 18 + 1))[: CHUNK_BYTES - 1] + "€ sit amet " * 50
    text = line + "x" * (2 * CHUNK_BYTES - len(line.encode()) - 1) + "\n\n" + "tail words\n"
    assert text.encode()[CHUNK_BYTES - 1 : CHUNK_BYTES + 2] == "€".encode()
    assert text.encode()[2 * CHUNK_BYTES - 1 : 2 * CHUNK_BYTES + 1] == b"\n\n"
    path = tmp_path / "traffic.txt"
    path.write_text(text)
    assert 271 in whole(text.encode())
    assert read(path) == whole(text.encode())


def test_text_with_no_place_to_cut_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic, "CHUNK_BYTES", 64)
    monkeypatch.setattr(traffic, "MAX_CARRY", 1000)
    path = tmp_path / "one-word.txt"
    path.write_text("a" * 5000)
    with pytest.raises(EngramError) as refused:
        read(path)
    assert str(refused.value) == (
        f"{path}: 1,024 characters in a row hold no place the tokenizer lets a chunk be cut (one word of its, or "
        "a run it keeps whole); split the text"
    )
