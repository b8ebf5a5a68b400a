"""Check the schema before compiling it: the 2020-12 meta-schema first, then every keyword must be one
the compiler understands. A keyword we cannot compile is an error, never silently dropped."""

from __future__ import annotations

from typing import Any

import jsonschema

from codegen.load import SchemaError

# Keywords that only annotate: they change no verdict.
ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples"})
# Keywords the validator compiler turns into code.
ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "minimum",
        "maximum",
        "minItems",
        "maxItems",
        "uniqueItems",
        "items",
        "properties",
        "required",
        "additionalProperties",
        "allOf",
        "anyOf",
        "not",
        "if",
        "then",
        "$ref",
        "$defs",
    }
)
# x-engram-* keys, each documented in schema/README.md.
EXTENSIONS = frozenset(
    {
        "x-engram-env",
        "x-engram-hash",
        "x-engram-rule",
        "x-engram-message",
        "x-engram-path",
        "x-engram-cli",
        "x-engram-default-from",
    }
)
TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})


def check_schema(document: dict[str, Any]) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(document)
    except jsonschema.SchemaError as exc:
        pointer = "/" + "/".join(str(p) for p in exc.absolute_path)
        raise SchemaError(f"schema fails the 2020-12 meta-schema at {pointer}: {exc.message}") from None
    if document.get("$schema") != "https://json-schema.org/draft/2020-12/schema":
        raise SchemaError('the schema must declare "$schema": "https://json-schema.org/draft/2020-12/schema"')
    _check_node(document, "", document)


def _check_node(node: Any, pointer: str, root: dict[str, Any]) -> None:
    if not isinstance(node, dict):
        raise SchemaError(f"{pointer or '/'}: boolean schemas are not supported; write an object schema")
    for key in node:
        if key.startswith("x-engram-"):
            if key not in EXTENSIONS:
                raise SchemaError(f"{pointer}/{key}: unknown extension keyword; known: {', '.join(sorted(EXTENSIONS))}")
        elif key.startswith("x-"):
            raise SchemaError(f"{pointer}/{key}: unknown extension keyword; only x-engram-* keys are compiled")
        elif key not in ANNOTATIONS and key not in ASSERTIONS:
            raise SchemaError(f"{pointer}/{key}: keyword {key!r} is not supported by the engram generator")
    _check_values(node, pointer, root)
    for key in ("properties", "$defs"):
        for name, child in node.get(key, {}).items():
            _check_node(child, f"{pointer}/{key}/{name}", root)
    for key in ("items", "not", "if", "then"):
        if key in node:
            _check_node(node[key], f"{pointer}/{key}", root)
    for key in ("allOf", "anyOf"):
        for i, child in enumerate(node.get(key, [])):
            _check_node(child, f"{pointer}/{key}/{i}", root)


def _check_values(node: dict[str, Any], pointer: str, root: dict[str, Any]) -> None:
    kind = node.get("type")
    if isinstance(kind, list) or (kind is not None and kind not in TYPES):
        raise SchemaError(f"{pointer}/type: only a single type name is supported, got {kind!r}")
    if "additionalProperties" in node and node["additionalProperties"] is not False:
        raise SchemaError(f"{pointer}/additionalProperties: only `false` is supported")
    if "if" in node:
        _check_rule(node, pointer)
    if "if" in node and "then" not in node:
        raise SchemaError(f"{pointer}: `if` needs a `then`")
    if "then" in node and "if" not in node:
        raise SchemaError(f"{pointer}: `then` needs an `if`")
    ref = node.get("$ref")
    if ref is not None:
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in root.get("$defs", {}):
            raise SchemaError(f"{pointer}/$ref: only local '#/$defs/<name>' references are supported, got {ref!r}")
    for i, rule in enumerate(node.get("allOf", [])):
        if "if" in rule:
            _check_rule(rule, f"{pointer}/allOf/{i}")
    if "x-engram-message" in node and "x-engram-rule" not in node:
        raise SchemaError(f"{pointer}: x-engram-message needs an x-engram-rule id")
    env = node.get("x-engram-env")
    if env is not None and (not isinstance(env, list) or not all(isinstance(v, str) for v in env)):
        raise SchemaError(f"{pointer}/x-engram-env: must be a list of environment variable names")
    if env is not None and node.get("type") != "boolean":
        raise SchemaError(f"{pointer}/x-engram-env: only boolean fields take environment defaults")
    hashed = node.get("x-engram-hash")
    if hashed is not None and not (
        isinstance(hashed, dict) and set(hashed) == {"exclude"} and isinstance(hashed["exclude"], str)
    ):
        raise SchemaError(f'{pointer}/x-engram-hash: write {{"exclude": "<reason>"}} to opt a field out')
    for key in ("x-engram-rule", "x-engram-message", "x-engram-path", "x-engram-cli", "x-engram-default-from"):
        if key in node and not isinstance(node[key], str):
            raise SchemaError(f"{pointer}/{key}: must be a string")


def _check_rule(rule: dict[str, Any], pointer: str) -> None:
    missing = [k for k in ("x-engram-rule", "x-engram-message", "x-engram-path") if k not in rule]
    if missing:
        raise SchemaError(f"{pointer}: an if/then rule needs {', '.join(missing)}")
    extra = set(rule) - {"if", "then", "x-engram-rule", "x-engram-message", "x-engram-path", "$comment"}
    if extra:
        raise SchemaError(
            f"{pointer}: an if/then rule holds only if, then and its x-engram-* keys; move {sorted(extra)}"
        )
