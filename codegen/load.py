"""Load the schema: read the file once, keep its text digest for the generated headers."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = ROOT / "schema" / "engram.schema.json"


@dataclass(frozen=True)
class LoadedSchema:
    path: Path
    document: dict[str, Any]
    sha256: str


class SchemaError(Exception):
    """The schema cannot be compiled; the message names the JSON pointer and what to change."""


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
