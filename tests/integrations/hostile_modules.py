"""Stand-ins for an engine whose modules misbehave, for the entry points that must never raise: a value
whose str() raises, an import that raises what it is given (SystemExit, KeyboardInterrupt), and an error
whose message cannot be made."""

from __future__ import annotations


class Raises:
    """An object whose str() raises (a hostile __version__, or an error's message)."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")


class Finder:
    """A meta path finder that makes importing `name` (and below) raise `error`."""

    def __init__(self, name: str, error: BaseException) -> None:
        self.name, self.error = name, error

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise self.error
        return None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message either")
