"""Field defaults from the environment: booleans with the spellings vLLM accepts, and text checked as its
field is."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engram.errors import ConfigError, Problem

TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})


def parse_bool(text: str) -> bool | None:
    """True/False for an accepted spelling (any case, surrounding spaces ignored), else None."""
    word = text.strip().lower()
    return True if word in TRUE else False if word in FALSE else None


def env_bool(env: Mapping[str, str], names: tuple[str, ...], default: bool, path: str) -> bool:
    """The first of `names` set in `env`, else `default`; a bad spelling names the variable.
    `path` is the JSON pointer of the field it defaults, for the error."""
    for name in names:
        if name in env:
            value = parse_bool(env[name])
            if value is None:
                raise ConfigError(
                    [
                        Problem(
                            path,
                            "env-bool",
                            f"{name}={env[name]!r} is not a boolean; use 1/true/yes/on or 0/false/no/off, or unset it",
                        )
                    ]
                )
            return value
    return default


def env_text(
    env: Mapping[str, str],
    names: tuple[str, ...],
    default: str | None,
    path: str,
    check: Callable[[object, str, list[Problem]], None],
) -> str | None:
    """The first of `names` set in `env`, else `default`; `check` (the field's generated check) refuses a
    value as the field would, and the error names the variable. `path`: the field's JSON pointer."""
    for name in names:
        if name in env:
            value = env[name]
            problems: list[Problem] = []
            check(value, path, problems)
            if problems:
                raise ConfigError(
                    [
                        Problem(p.path, p.rule, f"{name}={value[:200]!r}: {p.message}; change or unset it")
                        for p in problems
                    ]
                )
            return value
    return default
