"""Conformance cases written from the JSON Schema 2020-12 specification (core and validation), each
with the verdict the spec gives, checked against the generator and against jsonschema. They cover what
random schemas rarely reach: $id scopes, anchors, pointer escapes, $dynamicRef, unevaluated* through
every in-place applicator, exact decimals, ECMA-262 patterns, and the crashes and silent wrong answers
the old subset compiler had."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from codegen.load import SchemaError
from codegen.standalone import load_validator

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def doc(**keywords: Any) -> dict[str, Any]:
    return {"$schema": DRAFT, **keywords}


TREE = {  # the spec's extensible recursive schema: a strict tree forbids unknown fields at every depth
    "$schema": DRAFT,
    "$id": "https://example.com/strict-tree",
    "$dynamicAnchor": "node",
    "$ref": "tree",
    "unevaluatedProperties": False,
    "$defs": {
        "tree": {
            "$id": "tree",
            "$dynamicAnchor": "node",
            "type": "object",
            "properties": {"data": True, "children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
        }
    },
}

CASES: list[tuple[str, Any, list[tuple[Any, bool]]]] = [
    # -- references and identifiers --
    (
        "nested $id scopes resolve $ref against the nearest resource",
        doc(
            properties={"x": {"$ref": "http://example.com/b.json#/$defs/n"}},
            **{
                "$id": "http://example.com/root.json",
                "$defs": {
                    "n": {"type": "string"},
                    "b": {"$id": "b.json", "$defs": {"n": {"type": "integer"}}},
                },
            },
        ),
        [({"x": 1}, True), ({"x": "s"}, False)],
    ),
    (
        "$ref inside a nested resource reads its own $defs, not the root's",
        doc(
            **{
                "$id": "http://example.com/root.json",
                "$defs": {
                    "int": {"type": "string"},
                    "inner": {"$id": "inner.json", "$ref": "#/$defs/int", "$defs": {"int": {"type": "integer"}}},
                },
                "$ref": "inner.json",
            }
        ),
        [(3, True), ("3", False)],
    ),
    (
        "relative $id chains resolve against the nearest parent; absolute paths and empty fragments too",
        doc(
            **{
                "$id": "https://example.com/a/root.json#",
                "$defs": {
                    "b": {
                        "$id": "b/",
                        "$defs": {"c": {"$id": "c.json", "type": "integer"}, "d": {"$id": "/top.json", "minimum": 5}},
                    }
                },
                "properties": {
                    "c": {"$ref": "b/c.json"},
                    "c2": {"$ref": "https://example.com/a/b/c.json"},
                    "d": {"$ref": "/top.json"},
                    "self": {"$ref": "#"},
                },
                "additionalProperties": False,
            }
        ),
        [
            ({"c": 1, "c2": 2, "d": 6, "self": {"c": 3}}, True),
            ({"c": "1"}, False),
            ({"d": 4}, False),
            ({"self": {"x": 1}}, False),
        ],
    ),
    (
        "a $ref inside a nested resource to `#` is that resource's root",
        doc(
            **{
                "$id": "file:///schemas/root.json",
                "$defs": {"node": {"$id": "node.json", "properties": {"next": {"$ref": "#"}}, "required": ["v"]}},
                "$ref": "node.json",
            }
        ),
        [({"v": 1, "next": {"v": 2}}, True), ({"v": 1, "next": {}}, False)],
    ),
    (
        "$anchor, and a urn: base",
        doc(
            **{
                "$id": "urn:uuid:deadbeef-1234-ffff-ffff-4321feebdaed",
                "$defs": {"s": {"$anchor": "S", "type": "string"}},
                "$ref": "#S",
            }
        ),
        [("x", True), (1, False)],
    ),
    (
        "pointer escapes ~0 ~1 and percent-encoding",
        doc(
            **{
                "$defs": {"a/b": {"type": "integer"}, "c~d": {"minimum": 3}, 'e"f': {"maximum": 5}},
                "properties": {
                    "p": {"$ref": "#/$defs/a~1b"},
                    "q": {"$ref": "#/$defs/c~0d"},
                    "r": {"$ref": "#/$defs/e%22f"},
                },
            }
        ),
        [({"p": 1, "q": 3, "r": 5}, True), ({"p": 1.5}, False), ({"q": 2}, False), ({"r": 6}, False)],
    ),
    (
        "$ref to the root recurses by descending",
        doc(properties={"next": {"$ref": "#"}}, required=["v"]),
        [({"v": 1, "next": {"v": 2, "next": {"v": 3}}}, True), ({"v": 1, "next": {"next": {"v": 3}}}, False)],
    ),
    (
        "$ref beside other keywords: both apply",
        doc(**{"$defs": {"s": {"minLength": 2}}, "$ref": "#/$defs/s", "maxLength": 3}),
        [("ab", True), ("a", False), ("abcd", False)],
    ),
    (
        "$defs named like generated code does not replace it",
        doc(
            **{
                "$defs": {"document": {"type": "integer"}, "check_document": False},
                "properties": {"d": {"$ref": "#/$defs/document"}},
            }
        ),
        [({"d": 1}, True), ({"d": "x"}, False), ({}, True)],
    ),
    (
        "$dynamicRef: the outermost $dynamicAnchor wins (strict tree)",
        TREE,
        [
            ({"children": [{"data": 1}]}, True),
            ({"children": [{"daat": 1}]}, False),
            ({"daat": 1}, False),
        ],
    ),
    (
        "$dynamicRef: the item type of a generic collection is chosen by the resource that refers to it",
        doc(
            **{
                "$id": "https://example.com/shapes",
                "if": {"required": ["ints"]},
                "then": {"$ref": "ints"},
                "else": {"$ref": "words"},
                "$defs": {
                    "bag": {
                        "$id": "bag",
                        "properties": {"members": {"items": {"$dynamicRef": "#member"}}},
                        "$defs": {"any": {"$dynamicAnchor": "member"}},
                    },
                    "ints": {
                        "$id": "ints",
                        "$ref": "bag",
                        "$defs": {"m": {"$dynamicAnchor": "member", "type": "integer"}},
                    },
                    "words": {
                        "$id": "words",
                        "$ref": "bag",
                        "$defs": {"m": {"$dynamicAnchor": "member", "type": "string"}},
                    },
                },
            }
        ),
        [
            ({"ints": 1, "members": [1, 2]}, True),
            ({"ints": 1, "members": ["a"]}, False),
            ({"members": ["a"]}, True),
            ({"members": [1]}, False),
        ],
    ),
    (
        "$dynamicRef: a resource left behind (an `if` already evaluated) is no longer in the dynamic scope",
        doc(
            **{
                "$id": "https://example.com/scopes",
                "if": {"$id": "left", "$defs": {"t": {"$dynamicAnchor": "t", "type": "boolean"}}},
                "then": {"$id": "kept", "$ref": "jump", "$defs": {"t": {"$dynamicAnchor": "t", "type": "null"}}},
                "$defs": {
                    "jump": {"$id": "jump", "$dynamicRef": "first#t"},
                    "first": {"$id": "first", "$dynamicAnchor": "t", "type": "number"},
                },
            }
        ),
        [(None, True), (True, False), (1, False)],
    ),
    (
        "$dynamicRef with a resource part: the outermost binding wins over the resource named",
        doc(
            **{
                "$id": "https://example.com/outer",
                "$dynamicAnchor": "self",
                "properties": {"tag": {"const": "ok"}},
                "$ref": "base",
                "$defs": {
                    "base": {"$id": "base", "$dynamicAnchor": "self", "properties": {"child": {"$ref": "child"}}},
                    "child": {"$id": "child", "properties": {"next": {"$dynamicRef": "base#self"}}},
                },
            }
        ),
        [
            ({"tag": "ok", "child": {"next": {"tag": "ok"}}}, True),
            ({"tag": "ok", "child": {"next": {"tag": "no"}}}, False),
        ],
    ),
    (
        "$dynamicRef without a matching dynamic anchor in scope behaves as $ref",
        doc(
            **{
                "$id": "https://example.com/root",
                "$defs": {"a": {"$dynamicAnchor": "x", "type": "string"}},
                "$dynamicRef": "#x",
            }
        ),
        [("s", True), (1, False)],
    ),
    # -- applicators and unevaluated* --
    (
        "unevaluatedProperties sees properties through allOf, anyOf, if/then/else, dependentSchemas and $ref",
        doc(
            **{
                "$defs": {"r": {"properties": {"fromref": True}}},
                "$ref": "#/$defs/r",
                "properties": {"kind": True},
                "allOf": [{"properties": {"a": True}}],
                "anyOf": [
                    {"properties": {"b": True}, "required": ["b"]},
                    {"properties": {"c": True}, "required": ["c"]},
                ],
                "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
                "then": {"properties": {"x": True}},
                "else": {"properties": {"y": True}},
                "dependentSchemas": {"a": {"properties": {"dep": True}}},
                "unevaluatedProperties": False,
            }
        ),
        [
            ({"b": 1, "a": 1, "dep": 1, "fromref": 1, "kind": "x", "x": 1}, True),
            ({"b": 1, "kind": "z", "y": 1}, True),
            ({"b": 1, "kind": "z", "x": 1}, False),  # x is evaluated only when `if` holds
            ({"b": 1, "c": 1}, True),  # both anyOf branches pass: both annotate
            ({"b": 1, "dep": 1}, False),  # dependentSchemas applies only when `a` is present
            ({"c": 1, "other": 1}, False),
        ],
    ),
    (
        "annotations of a failed branch do not count",
        doc(anyOf=[{"properties": {"a": {"type": "string"}}}, True], unevaluatedProperties=False),
        [({"a": "s"}, True), ({"a": 1}, False), ({}, True)],
    ),
    (
        "not never annotates",
        doc(**{"not": {"not": {"properties": {"a": True}}}, "unevaluatedProperties": False}),
        [({}, True), ({"a": 1}, False)],
    ),
    (
        "unevaluatedItems after prefixItems, contains and nested items",
        doc(prefixItems=[{"type": "string"}], allOf=[{"contains": {"const": 7}}], unevaluatedItems=False),
        [(["a", 7], True), (["a", 7, 7], True), (["a", 7, 8], False), (["a"], False)],
    ),
    (
        "unevaluatedItems with a schema",
        doc(prefixItems=[True], unevaluatedItems={"type": "integer"}),
        [(["x", 1, 2], True), (["x", 1, "y"], False)],
    ),
    (
        "oneOf counts exactly one",
        doc(oneOf=[{"type": "integer"}, {"minimum": 2}]),
        [(1, True), (2.5, True), (3, False), ("s", True), (None, True)],
    ),
    (
        "contains with minContains 0 and maxContains",
        doc(contains={"type": "integer"}, minContains=0, maxContains=1),
        [([], True), (["a"], True), ([1, "a"], True), ([1, 2], False)],
    ),
    (
        "propertyNames and patternProperties with additionalProperties",
        doc(
            propertyNames={"maxLength": 3},
            patternProperties={"^x": {"type": "integer"}},
            additionalProperties={"type": "string"},
        ),
        [({"x1": 1, "ab": "s"}, True), ({"x1": "s"}, False), ({"ab": 1}, False), ({"long": "s"}, False)],
    ),
    (
        "dependentRequired",
        doc(dependentRequired={"card": ["billing", "name"]}),
        [({}, True), ({"card": 1, "billing": 1, "name": 1}, True), ({"card": 1, "name": 1}, False)],
    ),
    (
        "boolean subschemas, including inside allOf",
        doc(allOf=[True, {"properties": {"no": False}}]),
        [({"yes": 1}, True), ({"no": 1}, False)],
    ),
    (
        "required: [] inside anyOf, not and if accepts every object",
        doc(
            anyOf=[{"required": []}],
            **{"not": {"not": {"required": []}}, "if": {"required": []}, "then": {"type": "object"}},
        ),
        [({}, True), ({"a": 1}, True), ("s", False)],
    ),
    (
        "additionalProperties: false without properties, inside anyOf and not",
        doc(
            anyOf=[{"additionalProperties": False}, {"type": "string"}],
            **{"not": {"type": "object", "additionalProperties": False, "minProperties": 2}},
        ),
        [({}, True), ({"a": 1}, False), ("s", True)],
    ),
    (
        "property names that derived identifiers made collide",
        doc(
            properties={
                "a-b": {"type": "integer"},
                "a_b": {"type": "string"},
                "item": {"type": "null"},
                "all0": {"type": "boolean"},
            },
            items={"type": "integer"},
            allOf=[{"minProperties": 0}],
            required=["quote'\"", "new\nline"],
        ),
        [
            ({"a-b": 1, "a_b": "s", "item": None, "all0": True, "quote'\"": 1, "new\nline": 1}, True),
            ({"a-b": "s", "quote'\"": 1, "new\nline": 1}, False),
            ({"a_b": 1, "quote'\"": 1, "new\nline": 1}, False),
            ({"quote'\"": 1}, False),
        ],
    ),
    # -- validation keywords --
    ("multipleOf of a huge value by a small one", doc(multipleOf=0.123456789), [(1e308, False), (0.246913578, True)]),
    ("1.0 is an integer", doc(type="integer"), [(1.0, True), (1.5, False), (True, False)]),
    ("type lists", doc(type=["string", "null"]), [(None, True), ("s", True), (0, False)]),
    (
        "lengths count code points",
        doc(minLength=2, maxLength=2),
        [("\U0001f4a9\U0001f4a9", True), ("\U0001f4a9", False)],
    ),
    ("exclusive bounds", doc(exclusiveMinimum=1, exclusiveMaximum=3), [(2, True), (1, False), (3, False), ("s", True)]),
    (
        "min/maxProperties",
        doc(minProperties=1, maxProperties=2),
        [({"a": 1}, True), ({}, False), ({"a": 1, "b": 2, "c": 3}, False)],
    ),
    (
        "const and enum: true is not 1, 1 is 1.0",
        doc(enum=[1, [True], {"a": 0}]),
        [(1.0, True), (True, False), ([1], False), ({"a": 0.0}, True)],
    ),
    (
        "uniqueItems with JSON equality",
        doc(uniqueItems=True),
        [([1, True], True), ([1, 1.0], False), ([{"a": 1}, {"a": 1.0}], False)],
    ),
    ("format is an annotation by default", doc(format="date"), [("not a date", True)]),
]

# Where jsonschema departs from the spec, the spec's reading wins, so these are checked against their
# verdicts only: ECMA-262 reads some patterns differently from Python's `re`, and JSON numbers are
# decimals, which float division gets wrong (0.3 / 0.1 is 2.9999999999999996).
SPEC_ONLY_CASES: list[tuple[str, Any, list[tuple[Any, bool]]]] = [
    ("multipleOf is exact for decimals", doc(multipleOf=0.1), [(0.3, True), (0.7, True), (1e308, True), (0.35, False)]),
    (
        # The root schema is always a schema resource (core 4.3.5), with or without an $id, so it starts the
        # dynamic scope; jsonschema leaves an anonymous root out and answers False for [null].
        "$dynamicRef: an anonymous root's dynamic anchor is the outermost",
        doc(
            allOf=[{"$ref": "urn:example:lib"}],
            **{
                "$defs": {
                    "lib": {
                        "$id": "urn:example:lib",
                        "$defs": {"item": {"$dynamicAnchor": "item", "type": "string"}},
                        "items": {"$dynamicRef": "#item"},
                    },
                    "mine": {"$dynamicAnchor": "item", "type": "null"},
                }
            },
        ),
        [([None], True), (["s"], False)],
    ),
    (
        # $ref is static (core 8.2.3.1): only $dynamicRef consults the dynamic scope. jsonschema resolves a
        # $ref to a $dynamicAnchor dynamically when an outer resource declares the name, and answers True.
        "$ref to a $dynamicAnchor stays static when an outer dynamic anchor of the name is in scope",
        doc(
            allOf=[{"$ref": "urn:example:lib#item"}],
            **{
                "$id": "https://example.com/root",
                "$defs": {
                    "lib": {"$id": "urn:example:lib", "$defs": {"item": {"$dynamicAnchor": "item", "type": "string"}}},
                    "mine": {"$dynamicAnchor": "item", "type": "null"},
                },
            },
        ),
        [(None, False), ("s", True)],
    ),
    ("\\d is ASCII only", doc(pattern="^\\d+$"), [("123", True), ("\u0661\u0662", False)]),
    ("$ matches only at the very end", doc(pattern="^a$"), [("a", True), ("a\n", False)]),
    ("\\p{Letter} is a Unicode property", doc(pattern="^\\p{Letter}+$"), [("\u00e9t\u00e9", True), ("a1", False)]),
    ("\\w is ASCII only, also in a class", doc(pattern="^[\\w]+$"), [("a_1", True), ("\u00e9", False)]),
]


@pytest.mark.parametrize(("title", "schema", "cases"), CASES, ids=[c[0] for c in CASES])
def test_spec_cases(title: str, schema: Any, cases: list[tuple[Any, bool]]) -> None:
    check = load_validator(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    for instance, valid in cases:
        assert oracle.is_valid(instance) is valid, (title, instance, "the case itself is wrong")
        assert (check(instance) == []) is valid, (title, instance, check(instance))


@pytest.mark.parametrize(("title", "schema", "cases"), SPEC_ONLY_CASES, ids=[c[0] for c in SPEC_ONLY_CASES])
def test_spec_only_cases(title: str, schema: Any, cases: list[tuple[Any, bool]]) -> None:
    check = load_validator(schema)
    for instance, valid in cases:
        assert (check(instance) == []) is valid, (title, instance)


def test_messages_name_keyword_pointer_and_value() -> None:
    check = load_validator(doc(properties={"name": {"minLength": 3}}, unevaluatedProperties=False))
    assert [(p.path, p.rule, p.message) for p in check({"name": "ab", "odd": 1})] == [
        (
            "/name",
            "minLength",
            "expected at least 3 character(s) (minLength at /properties/name/minLength); got the string 'ab'",
        ),
        ("/odd", "unevaluatedProperties", "unknown field 'odd' (unevaluatedProperties at /unevaluatedProperties)"),
    ]


FORMATS = doc(
    **{
        "x-engram-format-assertion": True,
        "properties": {
            k: {"format": k}
            for k in (
                "date",
                "date-time",
                "time",
                "email",
                "ipv4",
                "ipv6",
                "hostname",
                "uri",
                "uuid",
                "regex",
                "json-pointer",
                "duration",
            )
        },
    }
)


@pytest.mark.parametrize(
    ("field", "good", "bad"),
    [
        ("date", "2024-02-29", "2023-02-29"),
        ("date-time", "1985-04-12T23:20:50.52Z", "1985-04-12 23:20:50"),
        ("time", "23:59:60Z", "22:59:60Z"),
        ("email", "joe.bloggs@example.com", "joe..bloggs@example.com"),
        ("ipv4", "192.168.0.1", "192.168.0.01"),
        ("ipv6", "::1", "::1%eth0"),
        ("hostname", "engram.example.com", "-bad.example.com"),
        ("uri", "https://example.com/a?b#c", "//no-scheme"),
        ("uuid", "2eb8aa08-aa98-11ea-b4aa-73b441d16380", "2eb8aa08aa9811eab4aa73b441d16380"),
        ("regex", "^\\p{Letter}$", "(unclosed"),
        ("json-pointer", "/a~0b/c~1d", "/a~2"),
        ("duration", "P1DT2H", "P1D2H"),
    ],
)
def test_format_assertion_opt_in(field: str, good: str, bad: str) -> None:
    check = load_validator(FORMATS)
    assert check({field: good}) == []
    assert [(p.path, p.rule) for p in check({field: bad})] == [(f"/{field}", "format")]
    assert check({field: 12}) == []  # formats constrain strings only


def test_a_schema_too_deep_to_compile_is_refused_with_the_fix() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(2000):
        schema = {"not": schema}
    with pytest.raises(SchemaError, match=r"nests too deeply .* move deep parts into \$defs"):
        load_validator(doc(**schema))


def test_a_schema_on_its_own_needs_no_dialect_but_refuses_another() -> None:
    assert load_validator({"type": "integer"})(1.0) == []
    with pytest.raises(SchemaError, match=r"/\$schema: 'http://json-schema.org/draft-07/schema#' declares another"):
        load_validator({"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer"})
