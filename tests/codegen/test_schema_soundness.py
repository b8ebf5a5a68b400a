"""Every node the compiler reaches is a checked schema (issue 23, item 4): non-schema roots, numbers JSON
cannot hold, references into data and references Python cannot parse are SchemaErrors naming the pointer,
never raw exceptions; a schema reached only through a $ref inside an unknown keyword is checked like any
other; non-finite instances are not multiples of anything."""

from __future__ import annotations

from typing import Any

import pytest

from codegen.load import SchemaError
from codegen.standalone import load_validator


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (5, "a schema is an object or a boolean, not int 5"),
        (None, "a schema is an object or a boolean, not NoneType null"),
        ([], "a schema is an object or a boolean, not list \\[\\]"),
        ("x", 'a schema is an object or a boolean, not str "x"'),
        ({"minimum": float("inf")}, "^/minimum: inf is not a JSON number"),
        ({"maximum": float("-inf")}, "^/maximum: -inf is not a JSON number"),
        ({"const": float("nan")}, "^/const: nan is not a JSON number"),
        ({"enum": [1, {"a": [float("nan")]}]}, "^/enum/1/a/0: nan is not a JSON number"),
        ({"default": float("inf")}, "^/default: inf is not a JSON number"),
        ({"$ref": "#/default", "default": {"type": 5}}, "points into 'default' at /, which holds data"),
        ({"$ref": "#/examples/0", "examples": [{"pattern": "("}]}, "points into 'examples' at /"),
        ({"$ref": "#/$defs/a/const", "$defs": {"a": {"const": {"type": 1}}}}, "points into 'const' at /\\$defs/a"),
        ({"$id": "http://[::1"}, "^/\\$id: 'http://\\[::1' is not a URI reference"),
        ({"$ref": "http://[::1"}, "^/\\$ref: 'http://\\[::1' is not a URI reference"),
        ({"$ref": "#/x/a", "x": {"a": {"x-engram-rule": "R"}}}, "^/x/a/x-engram-rule: 'R' is not a rule id"),
        ({"$ref": "#/x/a", "x": {"a": {"type": "nonsense"}}}, "fails the 2020-12 meta-schema at /x/a/type"),
    ],
)
def test_refused_with_the_pointer(schema: Any, message: str) -> None:
    with pytest.raises(SchemaError, match=message):
        load_validator(schema)


def test_a_schema_inside_an_unknown_keyword_still_compiles_when_sound() -> None:
    check = load_validator({"$ref": "#/definitions/a", "definitions": {"a": {"minimum": 3}}})
    assert [p.message for p in check(2)] == ["expected >= 3; got 2"] and check(3) == []


def test_non_finite_instances_are_multiples_of_nothing() -> None:
    check = load_validator({"multipleOf": 0.5})
    assert [len(check(v)) for v in (float("inf"), float("-inf"), float("nan"), 1e308, 7.5)] == [1, 1, 1, 0, 0]
    assert check(float("inf"))[0].message == "expected a multiple of 0.5 (multipleOf at /multipleOf); got inf"
