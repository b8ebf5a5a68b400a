"""JSON Schema patterns are ECMA-262 regular expressions. The `regex` package parses what Python's `re`
cannot (`\\p{Letter}`), and the few places where the two dialects disagree on the same text are
rewritten here: ECMA's `\\d` and `\\w` are ASCII only, and its `$` matches only at the very end."""

from __future__ import annotations

import functools

import regex

_CLASS_ESCAPES = {"d": "0-9", "w": "a-zA-Z0-9_"}
_OUTSIDE_ESCAPES = {"d": "[0-9]", "D": "[^0-9]", "w": "[a-zA-Z0-9_]", "W": "[^a-zA-Z0-9_]"}


def translate(source: str) -> str:
    """The `regex`-package spelling of an ECMA-262 pattern (no flags, as JSON Schema uses them)."""
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(source):
        ch = source[i]
        if ch == "\\" and i + 1 < len(source):
            escaped = source[i + 1]
            table = _CLASS_ESCAPES if in_class else _OUTSIDE_ESCAPES
            out.append(table.get(escaped, source[i : i + 2]))
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
        elif ch == "$":
            ch = r"\Z"
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def compile_pattern(source: str) -> regex.Pattern[str]:
    """The compiled pattern; raises regex.error for one no engine can parse."""
    return regex.compile(translate(source))


def is_pattern(source: str) -> bool:
    try:
        compile_pattern(source)
    except (regex.error, ValueError, OverflowError):
        return False
    return True
