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


# Each vLLM version the schema names (x-engram-vllm) -> the fields its EngramConfig has, in schema order.
VLLM_VERSIONS: dict[str, tuple[str, ...]] = {
    version: tuple(name for name, prop in _PROPERTIES.items() if version in prop.get("x-engram-vllm", ()))
    for version in sorted(
        {v for prop in _PROPERTIES.values() for v in prop.get("x-engram-vllm", ())},
        key=lambda v: tuple(map(int, v.split("."))),
    )
}
NEWEST_VLLM = list(VLLM_VERSIONS)[-1]


def vllm_digest(values: dict[str, Any], version: str = NEWEST_VLLM) -> str:
    """vLLM's digest of an EngramConfig with `values` (the schema's defaults elsewhere), written from its
    algorithm: sha256 of json.dumps of that version's fields, keys sorted."""
    import hashlib

    factors = {name: values.get(name, DEFAULTS[name]) for name in VLLM_VERSIONS[version]}
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()
