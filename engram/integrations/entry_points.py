"""What every engine plugin's entry point needs to never stop its engine: the one guarded way to serve or
stand aside, text of anything (a version, an error) that cannot raise and is bounded, and the version
numbers read from a bounded prefix."""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable

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


def serve_or_stand_aside(
    engine: str,
    unsupported: Callable[[str], str | None],
    install: Callable[[], None],
    stand_aside: Callable[[str, str], None],
) -> None:
    """An engine plugin's entry point: where module `engine` imports, `install` engram's classes into it
    when its version is one `unsupported` accepts, else (or when installing fails) `stand_aside(version,
    why)`. Never raises, whatever the engine's modules raise (SystemExit and KeyboardInterrupt included)
    and whatever its version or errors say."""
    with contextlib.suppress(BaseException):  # nothing may stop the engine from starting
        try:
            version = text_of(getattr(importlib.import_module(engine), "__version__", "unknown"))
        except BaseException:  # not inside the engine (or one that cannot be imported): nothing to do
            return
        problem = unsupported(version)
        if problem is None:
            try:
                install()
                return
            except BaseException as exc:  # internals that are not what this version had: it stays as it was
                problem = (
                    f"its Engram internals are not what engram expects ({text_of(type(exc).__name__)}: {text_of(exc)})"
                )
        stand_aside(version, problem)
