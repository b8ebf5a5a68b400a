"""A real-text corpus built offline from what every machine with Python has: the standard library of the
running interpreter, as code (the sources) and as English prose (its docstrings), plus the English man
pages where the machine has them (roff markup stripped). Tokenized with the real DeepSeek V4 tokenizer.

N-gram ids of real text repeat and cluster, unlike uniform random ids; the benchmarks and `engram
profile` use this corpus beside uniform ids. It is generated and cached (ENGRAM_CACHE_DIR), never
committed. Files are split into a "fit" part and a held-out part by a hash of their path, so a hot set
chosen on one part can be measured honestly on the other."""

from __future__ import annotations

import ast
import gzip
import hashlib
import re
import sys
import sysconfig
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.ngram.vocab import deepseek_v4_tokenizer
from engram.user_cache import cache_subdir, read_cached, save_cached

CORPUS_VERSION = 2
MAN_DIR = Path("/usr/share/man")
ROFF_REQUEST = re.compile(r"^[.'][^\n]*$", re.MULTILINE)
ROFF_ESCAPE = re.compile(r"\\f[BIRP]|\\\(..|\\[-&e|^]|\\s[+-]?\d")
MAX_FILE_BYTES = 1 << 20  # a few generated giants would otherwise dominate
MAN_BUDGET_CHARS = 12 << 20  # about as much man-page prose as the stdlib has code


@dataclass(frozen=True)
class Corpus:
    """Token ids of the corpus (int64), its parts' boundaries, and where each document starts."""

    tokens: torch.Tensor
    held_out_from: int  # tokens[:held_out_from] are the fit part, the rest held out
    sources: dict[str, int]  # tokens per source: code, prose, man

    @property
    def fit(self) -> torch.Tensor:
        return self.tokens[: self.held_out_from]

    @property
    def held_out(self) -> torch.Tensor:
        return self.tokens[self.held_out_from :]


def _held_out(path: Path) -> bool:
    return hashlib.sha256(str(path).encode()).digest()[0] < 52  # about 1 file in 5


def _docstrings(source: str) -> str:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    nodes = [
        tree,
        *(n for n in _statements(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)),
    ]
    return "\n\n".join(doc for node in nodes if (doc := ast.get_docstring(node)))


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """ast.walk's nodes in its order, less every expression and what lies below one: no definition lies
    inside an expression, and expressions are most of a module's nodes."""
    todo = deque([tree])
    while todo:
        node = todo.popleft()
        todo.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, ast.expr))
        yield node


def _man_text(path: Path) -> str:
    try:
        raw = gzip.decompress(path.read_bytes()[:MAX_FILE_BYTES]).decode("utf-8", "replace")
    except (OSError, EOFError, gzip.BadGzipFile):
        return ""
    return ROFF_ESCAPE.sub("", ROFF_REQUEST.sub("", raw))


def documents() -> list[tuple[str, Path, str]]:
    """(source, path, text) in a fixed order: stdlib code, stdlib docstrings, English man pages."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    out: list[tuple[str, Path, str]] = []
    for path in files:
        try:
            source = path.read_bytes()[:MAX_FILE_BYTES].decode("utf-8", "replace")
        except OSError:
            continue
        out.append(("code", path, source))
        prose = _docstrings(source)
        if prose:
            out.append(("prose", path, prose))
    pages = sorted(MAN_DIR.glob("man[1-8]/*.gz")) if MAN_DIR.is_dir() else []
    budget = MAN_BUDGET_CHARS
    for page in pages:
        text = _man_text(page)
        if budget <= 0:
            break
        if text:
            out.append(("man", page, text))
            budget -= len(text)
    return out


def _cache_path() -> Path:
    key = f"v{CORPUS_VERSION}-py{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    return cache_subdir("corpus") / f"{key}.npz"


def _read_corpus(f: BinaryIO) -> Corpus:
    with np.load(f, allow_pickle=False) as saved:
        names = [str(n) for n in saved["source_names"]]
        tokens = torch.from_numpy(saved["tokens"])
        if tokens.dtype != torch.int64 or tokens.dim() != 1:
            raise ValueError("not a corpus")
        return Corpus(
            tokens, int(saved["held_out_from"]), dict(zip(names, (int(c) for c in saved["source_counts"]), strict=True))
        )


def load_corpus() -> Corpus:
    """The corpus, tokenized once and cached."""
    path = _cache_path()
    cached = read_cached(path, _read_corpus)
    if cached is not None:
        return cached
    docs = documents()
    encoded = deepseek_v4_tokenizer().encode_batch([text for _, _, text in docs], add_special_tokens=False)
    fit: list[np.ndarray] = []
    held: list[np.ndarray] = []
    sources: dict[str, int] = {}
    for (source, doc_path, _), encoding in zip(docs, encoded, strict=True):
        ids = np.asarray(encoding.ids, dtype=np.int64)
        (held if _held_out(doc_path) else fit).append(ids)
        sources[source] = sources.get(source, 0) + ids.size
    tokens = np.concatenate(fit + held) if fit or held else np.empty(0, dtype=np.int64)
    held_out_from = sum(a.size for a in fit)
    source_names, source_counts = np.array(list(sources)), np.array(list(sources.values()), dtype=np.int64)
    save_cached(
        path,
        lambda f: np.savez(
            f, tokens=tokens, held_out_from=held_out_from, source_names=source_names, source_counts=source_counts
        ),
    )
    return Corpus(torch.from_numpy(tokens), held_out_from, sources)


def text_rows(spec: ModelSpec, tokens: torch.Tensor, batch_tokens: int, batches: int) -> list[torch.Tensor]:
    """Row ids [batch_tokens, layers, columns] of `batches` consecutive windows of real text, hashed as
    one stream with the spec's real hasher (compressed first where the family compresses)."""
    needed = batch_tokens * batches
    if tokens.numel() < needed:
        raise EngramError(
            f"the corpus has {tokens.numel():,} tokens; {batches} batches of {batch_tokens:,} need {needed:,}"
        )
    window = tokens[:needed]
    ids = spec.compress(window) if spec.family == "deepseek" else window
    rows: torch.Tensor = spec.hasher().hash(ids)
    return list(torch.split(rows, batch_tokens))
