"""`engram schema` and `engram docs`: the schema and the reference rendered from it."""

from __future__ import annotations

from importlib import resources
from typing import Any


def register(subparsers: Any) -> None:
    schema = subparsers.add_parser("schema", help="print the JSON Schema of a deployment document")
    schema.set_defaults(run=lambda args: _print("engram.schema.json"))
    docs = subparsers.add_parser("docs", help="print the Markdown configuration reference")
    docs.set_defaults(run=lambda args: _print("config.md"))


def _print(name: str) -> int:
    print(resources.files("engram._generated").joinpath(name).read_text(), end="")
    return 0
