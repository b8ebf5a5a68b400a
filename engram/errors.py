"""The error family: every mistake a user can make and fix (a configuration, a schema, a pattern, a
checkpoint, ids, the environment) raises an EngramError, whose message says what to change. The
command line catches this one type and prints its lines, one per problem; `engram` exports it.

    EngramError
      ConfigError (also a ValueError): a rejected configuration, every problem with its JSON pointer and rule
      SchemaError (codegen): a schema the generator cannot compile
      EcmaSyntaxError (also a ValueError): a pattern that is not ECMA-262
      PatternTimeout: a pattern match that ran past its time budget"""

from __future__ import annotations

from typing import NamedTuple


class EngramError(Exception):
    """A mistake a user can fix; the message says what to change. The command line prints it on one line
    and exits 2."""

    def lines(self) -> list[str]:
        """What the command line prints, a line each (without the leading 'error: ')."""
        return [str(self)]


class Problem(NamedTuple):
    """One thing wrong with a deployment: where (a JSON pointer), which rule, and what to change."""

    path: str
    rule: str
    message: str


MAX_PROBLEMS = 100  # a document with 100,000 unknown fields gets 100 lines and a count, not 100,000
MAX_TEXT = 2000  # characters of a path or message: a 1 MB key is shown as an excerpt


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TEXT else f"{text[: MAX_TEXT - 100]}... ({len(text):,} characters in all)"


class ConfigError(EngramError, ValueError):
    """A rejected configuration. `.errors` lists every problem found, not just the first (the first
    MAX_PROBLEMS of them and a count of the rest, each path and message of bounded length). A ValueError
    too, as vLLM's own config errors are."""

    def __init__(self, errors: list[Problem]) -> None:
        if not errors:
            raise ValueError("ConfigError needs at least one problem")
        kept = [Problem(_clip(p), r, _clip(m)) for p, r, m in errors[:MAX_PROBLEMS]]
        if len(errors) > MAX_PROBLEMS:
            more = len(errors) - MAX_PROBLEMS
            kept.append(
                Problem(
                    "/", "too-many-problems", f"and {more:,} more problems ({len(errors):,} in all); fix these first"
                )
            )
        self.errors = kept
        super().__init__("; ".join(f"{p.path}: {p.message} [{p.rule}]" for p in self.errors))

    def lines(self) -> list[str]:
        return [f"{p.path or '/'}: {p.message} [{p.rule}]" for p in self.errors]
