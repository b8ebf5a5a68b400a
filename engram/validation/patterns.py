"""JSON Schema patterns are ECMA-262 regular expressions: engram.validation.ecma parses each as
ECMAScript does and writes it in the `regex` package's syntax with ECMAScript's meaning.

Patterns are bounded before they are compiled: at most MAX_PATTERN characters, and at most
MAX_EXPANSION characters once every counted repeat is written out (`a{10000000}` would take gigabytes to
compile, `(?:a{1000}){1000}` seconds). The matches of one validation share one time budget
(MATCH_SECONDS, in pattern_budget): a pattern that backtracks without end, `(a|a)*$` on a long key, raises
PatternTimeout instead of hanging, and so do many slow matches together, however many keys or values
they run over."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import time
from collections.abc import Iterator

import regex

from engram.errors import EngramError
from engram.validation.ecma import translate, translate_strict

MAX_PATTERN = 4096
MAX_EXPANSION = 100_000
MATCH_SECONDS = 1.0
_REPEAT = regex.compile(r"\{(\d+)(?:,(\d*))?\}")


class PatternTimeout(EngramError):
    """A match ran past MATCH_SECONDS."""


def bound_problem(source: str) -> str | None:
    """Why `source` is too big to compile, or None: its length, or its size with every counted repeat
    written out (nested repeats multiply; alternatives add, an upper bound)."""
    if len(source) > MAX_PATTERN:
        return f"a pattern of {len(source):,} characters; at most {MAX_PATTERN:,}"
    totals, last, i, in_class = [0], 0, 0, False
    while i < len(source):
        ch = source[i]
        repeat = _REPEAT.match(source, i) if ch == "{" and not in_class else None
        if ch == "\\":
            i += 2
            if i < len(source) and source[i - 1] in "pPNux" and source[i] == "{":
                i = source.find("}", i) + 1 or len(source)
            if not in_class:
                totals[-1] += 1
                last = 1
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            totals[-1] += 1
            last = 1
        elif ch == "(":
            totals.append(0)
        elif ch == ")" and len(totals) > 1:
            last = totals.pop()
            totals[-1] += last
        elif repeat is not None:
            count = max(int(repeat.group(1)), int(repeat.group(2) or 0))
            if count > MAX_EXPANSION:
                return f"a repeat of {count:,}; at most {MAX_EXPANSION:,}"
            totals[-1] += last * (count - 1)
            last *= count
            i = repeat.end()
            if totals[-1] > MAX_EXPANSION:
                break
            continue
        elif ch not in "*+?|^$":
            totals[-1] += 1
            last = 1
        i += 1
    size = max(totals)
    return (
        f"counted repeats that expand to {size:,}+ characters; at most {MAX_EXPANSION:,}"
        if size > MAX_EXPANSION
        else None
    )


def _compile(source: str, cache: bool, strict: bool = False) -> regex.Pattern[str]:
    """`strict`: the u grammar only (the regex format), else Annex B too (engram.validation.ecma)."""
    problem = bound_problem(source)
    if problem:
        raise ValueError(problem)
    return regex.compile(translate_strict(source) if strict else translate(source), cache_pattern=cache)


@functools.lru_cache(maxsize=4096)
def compile_pattern(source: str) -> regex.Pattern[str]:
    """A schema's pattern, compiled once; raises regex.error for one no engine can parse and ValueError
    for one past the bounds."""
    return _compile(source, cache=True)


_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("pattern_deadline", default=None)


@contextlib.contextmanager
def pattern_budget(seconds: float = MATCH_SECONDS) -> Iterator[None]:
    """Every pattern match inside shares `seconds` (a validation's entry point opens one; a nested one
    keeps the outer budget)."""
    if _deadline.get() is not None:
        yield
        return
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def pattern_search(pattern: regex.Pattern[str], text: str) -> bool:
    """Whether `pattern` matches somewhere in `text`; PatternTimeout once the validation's pattern budget
    (or, outside one, MATCH_SECONDS for this match) is spent."""
    deadline = _deadline.get()
    left = MATCH_SECONDS if deadline is None else deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError
        return pattern.search(text, timeout=left) is not None
    except TimeoutError:
        raise PatternTimeout(
            f"pattern {pattern.pattern[:80]!r} on a string of {len(text):,} characters ran past the {MATCH_SECONDS:g} s "
            "that one validation's patterns may take"
        ) from None


def is_pattern(source: str) -> bool:
    """A schema's pattern: compiled and kept."""
    try:
        compile_pattern(source)
    except (regex.error, ValueError, OverflowError, MemoryError):
        return False
    return True


def is_instance_pattern(source: str) -> bool:
    """A pattern in instance data (format "regex", the u grammar only): checked without keeping it, so
    data cannot fill a cache with compiled patterns."""
    try:
        _compile(source, cache=False, strict=True)
    except (regex.error, ValueError, OverflowError, MemoryError):
        return False
    return True
