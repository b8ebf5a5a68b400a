"""The compressed vocabulary's key rules, on a small tokenizer built in the test."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from engram.ngram.vocab import build_lookup, normalizer


def test_normaliser_rules() -> None:
    norm = normalizer()
    assert norm.normalize_str("  Héllo\t\n World ") == "hello world"
    assert norm.normalize_str("ﬁ") == "fi"  # NFKC
    assert norm.normalize_str(" ") == " "  # exactly one space stays one space
    assert norm.normalize_str("\t\n") == " "  # a run of whitespace is one space, and stays
    assert norm.normalize_str("  x") == "x"


def word_level(vocab: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def test_keys_merge_in_first_seen_order() -> None:
    tokenizer = word_level(["<unk>", "Hello", "hello", "HÉLLO", "World", "world", "héllo"])
    assert build_lookup(tokenizer).tolist() == [0, 1, 1, 1, 2, 2, 1]


def test_partial_utf8_pieces_keep_their_token_strings() -> None:
    # Byte-level pieces of one character decode to U+FFFD alone; their token strings keep them apart.
    tokenizer = Tokenizer(models.BPE({"a": 0, "Ã": 1, "©": 2, "Ã©": 3}, []))
    tokenizer.decoder = decoders.ByteLevel()
    lookup = build_lookup(tokenizer)
    assert tokenizer.decode([1]) == "\ufffd" and tokenizer.decode([2]) == "\ufffd"
    assert lookup.tolist() == [0, 1, 2, 3]
