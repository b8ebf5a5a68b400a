"""The one error type for bad configuration, and the problem records it carries."""

from __future__ import annotations

from typing import NamedTuple


class Problem(NamedTuple):
    """One thing wrong with a deployment: where (a JSON pointer), which rule, and what to change."""

    path: str
    rule: str
    message: str


class ConfigError(ValueError):
    """A rejected configuration. `.errors` lists every problem found, not just the first."""

    def __init__(self, errors: list[Problem]) -> None:
        if not errors:
            raise ValueError("ConfigError needs at least one problem")
        self.errors = [Problem(*e) for e in errors]
        super().__init__("; ".join(f"{p.path}: {p.message} [{p.rule}]" for p in self.errors))


class EngramError(Exception):
    """A mistake a user can fix (bad checkpoint, ids, environment); the message says what to change.
    The command line prints it on one line and exits 2."""
