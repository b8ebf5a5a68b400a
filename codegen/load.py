"""Load the schema: read the file once, keep its text digest for the generated headers."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engram.errors import EngramError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "schema" / "engram.schema.json"


@dataclass(frozen=True)
class LoadedSchema:
    path: Path
    document: dict[str, Any]
    sha256: str


class SchemaError(EngramError):
    """The schema cannot be compiled; the message names the JSON pointer and what to change."""


MAX_INT_BITS = 13_000  # about 3,900 digits: past it Python cannot even print the number


def check_json_value(document: Any) -> None:
    """A schema given as Python values must be a JSON value before anything walks it: objects with
    string keys, arrays, strings, booleans, null and finite numbers of printable size (Python's json
    reads 1e999 as inf and NaN as nan; a set, bytes or a 5,000-digit integer cannot reach generated code
    as a literal either). Walked without recursion."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        pointer, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    raise SchemaError(
                        f"{pointer or '/'}: the key {str(key)[:80]!r} is not a string; JSON object keys are"
                    )
                stack.append((f"{pointer}/{key.replace('~', '~0').replace('/', '~1')}", item))
        elif isinstance(value, list | tuple):
            stack += [(f"{pointer}/{i}", v) for i, v in enumerate(value)]
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise SchemaError(f"{pointer or '/'}: {value!r} is not a JSON number (write a finite one)")
        elif isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > MAX_INT_BITS:
                raise SchemaError(
                    f"{pointer or '/'}: an integer of {value.bit_length():,} bits is too large for a schema"
                )
        elif not (value is None or isinstance(value, str | bool)):
            raise SchemaError(f"{pointer or '/'}: a Python {type(value).__name__} is not a JSON value")


def too_deep() -> SchemaError:
    return SchemaError(
        "the schema nests too deeply to check and compile (past Python's recursion limit); "
        "move deep parts into $defs and refer to them with $ref"
    )


def load_schema(path: Path = SCHEMA_PATH) -> LoadedSchema:
    raw = path.read_bytes()
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise SchemaError(f"{path}: the schema must be a JSON object")
    return LoadedSchema(path=path, document=document, sha256=hashlib.sha256(raw).hexdigest())
