"""`engram schema` and `engram docs`: the schema and the reference rendered from it."""

from __future__ import annotations

from importlib import resources
from typing import Any

from engram.commands import add_command


def register(subparsers: Any) -> None:
    schema = add_command(subparsers, "schema")
    schema.set_defaults(run=lambda args: _print("engram.schema.json"))
    docs = add_command(subparsers, "docs")
    docs.set_defaults(run=lambda args: _print("config.md"))


def _print(name: str) -> int:
    print(resources.files("engram._generated").joinpath(name).read_text(), end="")
    return 0
