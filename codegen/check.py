"""Check the schema before compiling it: the 2020-12 meta-schema first (patterns read as ECMA-262, so
`\\p{Letter}` is a valid pattern), then what the meta-schema cannot say: the x-engram-* extensions,
engram's if/then rules, and keywords that are almost certainly mistakes."""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Mapping
from typing import Any
from urllib.parse import urldefrag

import jsonschema

from codegen.index import SchemaIndex, children
from codegen.load import SchemaError, check_json_value
from codegen.validators import is_rule
from engram.validation.patterns import bound_problem, is_pattern

DRAFT = "https://json-schema.org/draft/2020-12/schema"
VOCABULARIES = frozenset(
    f"https://json-schema.org/draft/2020-12/vocab/{name}"
    for name in (
        "core",
        "applicator",
        "unevaluated",
        "validation",
        "meta-data",
        "format-annotation",
        "format-assertion",
        "content",
    )
)
# Every keyword of the 2020-12 core, applicator, unevaluated, validation, meta-data, format-annotation
# and content vocabularies. Anything else is an annotation, as the spec says, unless it is listed below.
KEYWORDS = frozenset(
    {
        *("$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment", "$defs"),
        *("prefixItems", "items", "contains", "additionalProperties", "properties", "patternProperties"),
        *("dependentSchemas", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf", "not"),
        *("unevaluatedItems", "unevaluatedProperties", "type", "const", "enum", "multipleOf", "maximum"),
        *("exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems"),
        *("minItems", "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required"),
        *("dependentRequired", "title", "description", "default", "deprecated", "readOnly", "writeOnly"),
        *("examples", "format", "contentEncoding", "contentMediaType", "contentSchema"),
        "dependencies",  # the 2020-12 meta-schema still describes it; honoured, as the spec's appendix allows
    }
)
# Keywords of older drafts: 2020-12 ignores them (they are annotations there, as jsonschema treats them),
# so they compile to nothing, with a warning naming the 2020-12 keyword that replaced each.
REPLACED = {
    "additionalItems": "items (after prefixItems)",
    "$recursiveRef": "$dynamicRef",
    "$recursiveAnchor": "$dynamicAnchor",
}
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
        "x-engram-format-assertion",
        "x-engram-older-names",
        "x-engram-vllm",
        "x-engram-checks",
    }
)
# What engram's own keywords may hold: they reach generated code (as literals) and messages, so each has
# a grammar, checked before anything compiles.
GRAMMARS = {
    "x-engram-rule": (
        re.compile(r"(?=.{1,64}$)[a-z][a-z0-9]*(-[a-z0-9]+)*", re.ASCII),
        "a rule id (lowercase words joined by '-', at most 64 characters)",
    ),
    "x-engram-env": (re.compile(r"[A-Z_][A-Z0-9_]{0,127}", re.ASCII), "an environment variable name (A-Z, 0-9, _)"),
    "x-engram-cli": (
        re.compile(r"--[a-z][a-z0-9]*(-[a-z0-9]+)*", re.ASCII),
        "a command-line flag such as --data-parallel-size",
    ),
    "x-engram-default-from": (re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}", re.ASCII), "a field name"),
    "x-engram-vllm": (re.compile(r"(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})", re.ASCII), "a vLLM version such as 0.34"),
}
MAX_MESSAGE = 4096
POINTER = re.compile(r"(/[a-z_]{1,64}){1,4}", re.ASCII)  # a deployment field, as a check's problem names it
# A message is filled at validation time with str.format: only these fields, no attribute or index
# access, no format spec (a width would let a message grow without bound), and only the !r conversion.
MESSAGE_FIELDS = frozenset({"value", "problems"})


def check_message(message: str, pointer: str) -> None:
    """A rule's message template: `{value!r}` (the offending value, shown bounded) and `{problems}` only."""
    if len(message) > MAX_MESSAGE:
        raise SchemaError(f"{pointer}: a message of {len(message):,} characters; at most {MAX_MESSAGE:,}")
    try:
        parts = list(string.Formatter().parse(message))
    except ValueError as exc:
        raise SchemaError(f"{pointer}: not a message template ({exc}); write literal braces as {{{{ and }}}}") from None
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if field not in MESSAGE_FIELDS or spec or conversion not in (None, "r"):
            shown = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise SchemaError(
                f"{pointer}: {shown[:80]!r} is not a placeholder a message may use: {{value!r}} or {{problems}}"
            )


RULE_KEYS = frozenset({"if", "then", "x-engram-rule", "x-engram-message", "x-engram-path", "$comment"})


def _meta_validator() -> jsonschema.protocols.Validator:
    checker = jsonschema.FormatChecker()
    checker.checkers = dict(jsonschema.Draft202012Validator.FORMAT_CHECKER.checkers)
    checker.checks("regex")(lambda v: not isinstance(v, str) or is_pattern(v))
    meta = jsonschema.Draft202012Validator.META_SCHEMA
    return jsonschema.Draft202012Validator(meta, format_checker=checker)


def check_schema(
    document: dict[str, Any], *, require_dialect: bool = True, resources: Mapping[str, Any] | None = None
) -> list[str]:
    """Raise SchemaError for what cannot be compiled or is almost surely a mistake; return warnings.
    `require_dialect`: the root must say `"$schema"` (a schema file must; a schema compiled on its own
    is read as 2020-12 without it). `resources`: the local documents references may reach (each one they
    reach is checked as the document is)."""
    check_json_value(document)
    error = jsonschema.exceptions.best_match(_meta_validator().iter_errors(document))
    if error is not None:
        pointer = "".join(f"/{p}" for p in error.absolute_path)
        bounds = (
            bound_problem(error.instance) if error.validator == "format" and isinstance(error.instance, str) else None
        )
        detail = f"{error.instance[:80]!r} is too big a pattern to compile: {bounds}" if bounds else error.message
        raise SchemaError(f"schema fails the 2020-12 meta-schema at {pointer or '/'}: {detail}")
    if require_dialect and document.get("$schema") != DRAFT:
        raise SchemaError(f'the schema must declare "$schema": "{DRAFT}"')
    if "x-engram-format-assertion" in document and not isinstance(document["x-engram-format-assertion"], bool):
        raise SchemaError("/x-engram-format-assertion: must be true or false")
    _check_runtime_checks(document.get("x-engram-checks", []))
    index = SchemaIndex(document, resources)
    for name, uri in index.origin.items():  # the local resources the document reaches
        dialect = index.bundled[name].get("$schema", DRAFT) if isinstance(index.bundled[name], dict) else DRAFT
        if not isinstance(dialect, str) or urldefrag(dialect)[0] != DRAFT:
            raise SchemaError(
                f"the local resource {uri} declares $schema {str(dialect)[:200]!r}: only 2020-12 documents are compiled (an older draft's keywords mean other things); convert it to 2020-12"
            )
        check_json_value(index.bundled[name])
        error = jsonschema.exceptions.best_match(_meta_validator().iter_errors(index.bundled[name]))
        if error is not None:
            at = "".join(f"/{p}" for p in error.absolute_path)
            raise SchemaError(f"the local resource {uri} fails the 2020-12 meta-schema at {at or '/'}: {error.message}")
    declared = {
        node["$schema"].rstrip("#")
        for node in map(index.at, index.base)
        if isinstance(node, dict) and isinstance(node.get("$schema"), str) and node["$schema"].rstrip("#") != DRAFT
    }  # only the dialects named are looked up: a directory's other documents stay unread
    dialects = frozenset(uri for uri in declared if uri in index.local and _is_2020_12_dialect(index.local[uri]))
    warnings: list[str] = []
    for pointer in index.base:
        if pointer.startswith("~meta"):
            continue  # a bundled meta-schema
        node = index.at(pointer)
        if isinstance(node, dict):
            _check_node(node, pointer, dialects)
            warnings += [
                f"{pointer}/{key}: {key!r} is not a 2020-12 keyword, so it does nothing here; use {REPLACED[key]}"
                for key in node
                if key in REPLACED
            ]
            for key in ("$ref", "$dynamicRef"):  # a reference that leaves the document is refused now
                if isinstance(node.get(key), str):
                    target = index.resolve(node[key], index.base[pointer], f"{pointer}/{key}")
                    if target not in index.base:  # inside an unknown keyword: checked as a schema here
                        _check_subtree(index, target)
    return warnings


CHECK_KEYS = frozenset({"rule", "path", "description"})


def _check_runtime_checks(checks: Any) -> None:
    """x-engram-checks: the rules code checks where JSON Schema cannot (they need the node, or the
    tables' bytes), each a rule id, the pointer its problem names, and a description for the docs."""
    if not isinstance(checks, list):
        raise SchemaError("/x-engram-checks: must be a list of {rule, path, description} objects")
    for i, check in enumerate(checks):
        at = f"/x-engram-checks/{i}"
        if not isinstance(check, dict) or set(check) != CHECK_KEYS:
            raise SchemaError(f"{at}: must hold exactly rule, path and description")
        rule, rule_what = GRAMMARS["x-engram-rule"]
        if not isinstance(check["rule"], str) or not rule.fullmatch(check["rule"]):
            raise SchemaError(f"{at}/rule: {str(check['rule'])[:80]!r} is not {rule_what}")
        if not isinstance(check["path"], str) or not POINTER.fullmatch(check["path"]):
            raise SchemaError(f"{at}/path: a JSON pointer into the deployment document, such as /engram/cpu_offload")
        if not isinstance(check["description"], str) or not 0 < len(check["description"]) <= MAX_MESSAGE:
            raise SchemaError(f"{at}/description: a description of at most {MAX_MESSAGE:,} characters")


def _is_2020_12_dialect(meta: Any) -> bool:
    """A meta-schema (a local resource) of 2020-12 that uses only vocabularies engram compiles."""
    if not isinstance(meta, dict) or not isinstance(meta.get("$vocabulary"), dict):
        return False
    dialect = meta.get("$schema")
    return isinstance(dialect, str) and dialect.rstrip("#") == DRAFT and set(meta["$vocabulary"]) <= VOCABULARIES


def _check_subtree(index: SchemaIndex, pointer: str) -> None:
    """A schema reached only by a $ref (inside a keyword 2020-12 does not know), checked as every other:
    against the meta-schema, then node by node."""
    node = index.at(pointer)
    error = jsonschema.exceptions.best_match(_meta_validator().iter_errors(node))
    if error is not None:
        at = pointer + "".join(f"/{p}" for p in error.absolute_path)
        raise SchemaError(f"the schema a $ref names fails the 2020-12 meta-schema at {at}: {error.message}")
    stack = [(pointer, node)]
    while stack:
        at, sub = stack.pop()
        if isinstance(sub, dict):
            _check_node(sub, at)
        stack += children(sub, at)


def _check_node(node: dict[str, Any], pointer: str, dialects: frozenset[str] = frozenset()) -> None:
    for key in node:
        if key.startswith("x-engram-"):
            if key not in EXTENSIONS:
                raise SchemaError(f"{pointer}/{key}: unknown extension keyword; known: {', '.join(sorted(EXTENSIONS))}")
            if key == "x-engram-format-assertion" and pointer:
                raise SchemaError(f"{pointer}/{key}: format assertion is chosen once, at the schema's root")
        elif key.startswith("x-"):
            raise SchemaError(f"{pointer}/{key}: unknown extension keyword; only x-engram-* keys are compiled")
        elif key not in KEYWORDS and key not in REPLACED:
            near = difflib.get_close_matches(key, KEYWORDS, n=1, cutoff=0.8)
            near += [k for k in KEYWORDS if k.lower() == key.lower()]
            if near:
                raise SchemaError(
                    f"{pointer}/{key}: unknown keyword {key!r} would be ignored; did you mean {near[0]!r}?"
                )
    if "$schema" in node and node["$schema"].rstrip("#") not in {DRAFT, *dialects}:
        raise SchemaError(
            f"{pointer}/$schema: {node['$schema']!r} declares another dialect or vocabulary set; "
            f"the generator compiles {DRAFT} only, or a local meta-schema of its vocabularies"
        )
    if is_rule(node):
        _check_rule(node, pointer)
    elif "x-engram-path" in node:
        raise SchemaError(f"{pointer}/x-engram-path: only an if/then rule with an x-engram-rule takes a path")
    if "x-engram-message" in node and "x-engram-rule" not in node:
        raise SchemaError(f"{pointer}: x-engram-message needs an x-engram-rule id")
    env = node.get("x-engram-env")
    if env is not None and (not isinstance(env, list) or not all(isinstance(v, str) for v in env)):
        raise SchemaError(f"{pointer}/x-engram-env: must be a list of environment variable names")
    if env is not None and node.get("type") not in ("boolean", "string", ["string", "null"]):
        raise SchemaError(f"{pointer}/x-engram-env: only boolean and string fields take environment defaults")
    hashed = node.get("x-engram-hash")
    if hashed is not None and not (
        isinstance(hashed, dict) and set(hashed) == {"exclude"} and isinstance(hashed["exclude"], str)
    ):
        raise SchemaError(f'{pointer}/x-engram-hash: write {{"exclude": "<reason>"}} to opt a field out')
    for key in ("x-engram-rule", "x-engram-message", "x-engram-path", "x-engram-cli", "x-engram-default-from"):
        if key in node and not isinstance(node[key], str):
            raise SchemaError(f"{pointer}/{key}: must be a string")
    for key, (grammar, what) in GRAMMARS.items():
        values = node.get(key, [])
        for value in values if isinstance(values, list) else [values]:
            if not isinstance(value, str) or not grammar.fullmatch(value):
                raise SchemaError(f"{pointer}/{key}: {value[:80]!r} is not {what}")
    if "x-engram-message" in node:
        check_message(node["x-engram-message"], f"{pointer}/x-engram-message")
    older = node.get("x-engram-older-names")
    if older is not None and not (
        isinstance(older, list) and older and all(isinstance(n, str) and n.isidentifier() for n in older)
    ):
        raise SchemaError(f"{pointer}/x-engram-older-names: must be a non-empty list of field names (identifiers)")
    versions = node.get("x-engram-vllm")
    if versions is not None and not (isinstance(versions, list) and versions and len(set(versions)) == len(versions)):
        raise SchemaError(
            f'{pointer}/x-engram-vllm: list the vLLM versions whose EngramConfig has the field (such as ["0.33", "0.34"]), or leave it out'
        )
    if versions is not None and hashed is not None:
        raise SchemaError(f"{pointer}/x-engram-hash: vLLM hashes its own fields (x-engram-vllm); drop the exclusion")


def _check_rule(rule: dict[str, Any], pointer: str) -> None:
    missing = [k for k in ("then", "x-engram-rule", "x-engram-message", "x-engram-path") if k not in rule]
    if missing:
        raise SchemaError(f"{pointer}: an if/then rule needs {', '.join(missing)}")
    extra = set(rule) - RULE_KEYS
    if extra:
        raise SchemaError(
            f"{pointer}: an if/then rule holds only if, then and its x-engram-* keys; move {sorted(extra)}"
        )
    path = rule["x-engram-path"]
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise SchemaError(f"{pointer}/x-engram-path: a JSON pointer such as /field, relative to the rule's object")
