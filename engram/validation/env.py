"""Boolean values from the environment, with the spellings vLLM accepts."""

from __future__ import annotations

from collections.abc import Mapping

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
