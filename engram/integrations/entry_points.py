"""What every engine plugin's entry point needs to never stop its engine: text of anything (a version,
an error) that cannot raise and is bounded, and the version numbers read from a bounded prefix."""

from __future__ import annotations

import re

TEXT_LIMIT = 200  # characters of a version or an error shown: a hostile one is cut, never a crash


def text_of(value: object) -> str:
    """`str(value)` cut to TEXT_LIMIT characters, or a placeholder where str() itself fails."""
    try:
        text = str(value)
        return text if len(text) <= TEXT_LIMIT else text[:TEXT_LIMIT] + "..."
    except BaseException:
        return "<unprintable>"


def version_numbers(version: str, count: int) -> tuple[int, ...] | None:
    """The first `count` dot-separated numbers of `version` (at most six digits each), or None."""
    found = re.match(r"\.".join([r"(\d{1,6})"] * count) + r"(?!\d)", version[:TEXT_LIMIT])
    return None if found is None else tuple(int(part) for part in found.groups())
