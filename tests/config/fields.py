"""The EngramConfig fields as the schema lists them, in its order, and the defaults it gives them: what
the tests compare messages against, never written out by hand (a new field changes no test)."""

from __future__ import annotations

import json
from typing import Any

from codegen.load import SCHEMA_PATH

_PROPERTIES: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())["$defs"]["EngramConfig"]["properties"]
ENGRAM_FIELDS = tuple(_PROPERTIES)
KNOWN_FIELDS = ", ".join(ENGRAM_FIELDS)  # as an unknown-field message lists them
DEFAULTS = {name: prop.get("default") for name, prop in _PROPERTIES.items()}


def shown(**given: Any) -> str:
    """`engram validate`'s line of the resolved config: every field's JSON value, the schema's default
    unless `given`."""
    return "engram: " + " ".join(f"{name}={json.dumps(given.get(name, DEFAULTS[name]))}" for name in ENGRAM_FIELDS)
