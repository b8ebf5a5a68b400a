"""The optional half of 2020-12 that engram implements (issue 23, item 6): every format of the standard
asserted under the format-assertion vocabulary (a meta-schema that declares it, as a local resource) or
`x-engram-format-assertion`; `dependencies` honoured as the spec's appendix allows; bignums and float
overflow; references to other drafts refused by name. Each verdict here is exact."""

from __future__ import annotations

from typing import Any

import pytest

from codegen.load import SchemaError
from codegen.standalone import load_validator
from engram.validation.string_formats import CHECKS

CASES: dict[str, list[tuple[str, bool]]] = {
    "uri": [
        ("http://foo.bar/?baz=qux#quux", True),
        ("http://[2001:db8::7]/c=GB?objectClass?one", True),
        ("http://-.~_!$&'()*+,;=:%40:80%2f::::::@example.com", True),
        ("urn:oasis:names:specification:docbook:dtd:xml:4.1.2", True),
        ("//foo.bar/?baz=qux#quux", False),  # relative
        ("\\\\WINDOWS\\fileshare", False),
        ("http:// shouldfail.com", False),
        ("bar,baz:foo", False),  # not a scheme
        ("https://[@example.org/test.txt", False),
        ("http://\u0192\u00f8\u00f8.com", False),  # an IRI, not a URI
        ("http://[1:2:3]/", False),  # not an IPv6 address
    ],
    "uri-reference": [("/abc", True), ("#fragment", True), ("abc", True), ("#frag\\ment", False), ("a b", False)],
    "iri": [
        ("http://\u0192\u00f8\u00f8.\u00df\u00e5r/?\u2202\u00e9\u0153=\u03c0\u00eex#\u03c0\u00ee\u00fcx", True),
        ("http://[2001:0db8:85a3:0000:0000:8a2e:0370:7334]", True),
        ("http://2001:0db8:85a3:0000:0000:8a2e:0370:7334", False),
        ("/abc", False),
    ],
    "iri-reference": [
        ("/\u00e2\u03c0\u03c0", True),
        ("#\u0192r\u00e4gm\u00eant", True),
        ("#\u0192r\u00e4g\\m\u00eant", False),
    ],
    "uri-template": [
        ("http://example.com/dictionary/{term:1}/{term}", True),
        ("{+path}/here{?x,y*}", True),
        ("http://example.com/dictionary/{term:1}/{term", False),
        ("{x:10000}", False),
        ("{x:0}", False),
        ("{}", False),
    ],
    "relative-json-pointer": [
        ("0/foo/bar", True),
        ("0#", True),
        ("120/foo/bar", True),
        ("0+1/foo", True),  # index manipulation
        ("1-2/bar", True),
        ("0-01", False),
        ("0++1", False),
        ("1#/foo", False),
        ("/foo/bar", False),
        ("-1/foo", False),
        ("0##", False),
        ("01/a", False),
        ("", False),
    ],
    "idn-hostname": [
        ("\uc2e4\ub840.\ud14c\uc2a4\ud2b8", True),
        ("xn--ihqwcrb4cv8a8dqg056pqjye", True),
        ("l\u00b7l", True),  # MIDDLE DOT between two l: its context rule holds
        ("a\u3002b", True),  # an ideographic full stop separates labels
        ("\u00b7l", False),
        ("xn--X", False),  # not Punycode
        ("ab--c", False),  # hyphens in the third and fourth place
        ("-hello", False),
        ("\u302e\uc2e4\ub840.\ud14c\uc2a4\ud2b8", False),  # starts with a combining mark
        ("", False),
        ("example.", False),  # no empty label, trailing or leading, whichever dot
        ("\uff61example", False),
        ("\u03c0\u03b1\u03c1\u03ac\u03b4\u03b5\u03b9\u03b3\u03bc\u03b1" * 6 + "\uff0ecom", True),  # 60 characters
        ("\u03c0\u03b1\u03c1\u03ac\u03b4\u03b5\u03b9\u03b3\u03bc\u03b1" * 7 + ".com", False),  # 70
    ],
    "idn-email": [("\uc2e4\ub840@\uc2e4\ub840.\ud14c\uc2a4\ud2b8", True), ("joe@example.com", True), ("2962", False)],
    "duration": [("P4DT12H30M5S", True), ("P4Y", True), ("PT1D", False), ("P", False), ("P1W", True), ("P1Y2W", False)],
    "regex": [("^a{2}$", True), ("\\a", False), ("a{,2}", False)],  # the u grammar only
}


def format_meta(required: bool) -> dict[str, Any]:
    """A 2020-12 meta-schema with the format-assertion vocabulary, required (true) or optional (false)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"http://meta.test/format-assertion-{str(required).lower()}.json",
        "$vocabulary": {
            "https://json-schema.org/draft/2020-12/vocab/core": True,
            "https://json-schema.org/draft/2020-12/vocab/format-assertion": required,
        },
    }


@pytest.mark.parametrize(("name", "text", "valid"), [(n, t, v) for n, items in CASES.items() for t, v in items])
def test_each_format(name: str, text: str, valid: bool) -> None:
    assert CHECKS[name](text) is valid


def test_every_format_of_the_standard_can_be_asserted() -> None:
    standard = {"date-time", "date", "time", "duration", "email", "idn-email", "hostname", "idn-hostname", "ipv4"}
    standard |= {"ipv6", "uri", "uri-reference", "iri", "iri-reference", "uuid", "uri-template", "json-pointer"}
    standard |= {"relative-json-pointer", "regex"}
    assert set(CHECKS) == standard


def test_a_meta_schema_that_requires_the_format_assertion_vocabulary_asserts_formats() -> None:
    """Required (true): asserted; optional (false): annotations, as without it (the test suite's reading)."""
    metas = {meta["$id"]: meta for meta in (format_meta(True), format_meta(False))}
    schema = {"$schema": format_meta(True)["$id"], "format": "ipv4"}
    asserting = load_validator(schema, metas)
    assert asserting("127.0.0.1") == [] and [p.rule for p in asserting("not-an-ipv4")] == ["format"]
    assert load_validator({**schema, "$schema": format_meta(False)["$id"]}, metas)("not-an-ipv4") == []
    assert load_validator({"format": "ipv4"})("not-an-ipv4") == []  # the default: an annotation
    resources = metas
    with pytest.raises(SchemaError, match=r"^/format: format 'made-up' cannot be asserted; known: date, "):
        load_validator({**schema, "format": "made-up"}, resources)


@pytest.mark.parametrize(
    ("instance", "rules"),
    [
        ({"bar": 1}, [("/foo", "dependencies")]),
        ({"bar": 1, "foo": 2}, []),
        ({"quux": 1}, [("/baz", "required")]),
        ({"never": 1}, [("", "false")]),
        ({"other": 1}, []),
        (["bar"], []),
    ],
)
def test_dependencies_are_honoured(instance: Any, rules: list[tuple[str, str]]) -> None:
    validate = load_validator({"dependencies": {"bar": ["foo"], "quux": {"required": ["baz"]}, "never": False}})
    assert [(p.path, p.rule) for p in validate(instance)] == rules


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        ({"type": "integer"}, 12345678910111213141516171819202122232425262728293031, 1.5),
        ({"maximum": 18446744073709551615}, 18446744073709551600, 18446744073709551616),
        ({"minimum": -18446744073709551615}, -18446744073709551600, -18446744073709551616),
        ({"type": "integer", "multipleOf": 0.5}, 1e308, 1.25),  # 1e308 / 0.5 overflows a float
    ],
)
def test_bignums_and_float_overflow(schema: dict[str, Any], valid: Any, invalid: Any) -> None:
    validate = load_validator(schema)
    assert validate(valid) == [] and validate(invalid) != []


def test_a_reference_to_another_draft_is_refused_by_name() -> None:
    older = {"$schema": "https://json-schema.org/draft/2019-09/schema", "prefixItems": [{"type": "string"}]}
    with pytest.raises(SchemaError) as raised:
        load_validator({"$ref": "http://x.test/older.json"}, {"http://x.test/older.json": older})
    assert str(raised.value) == (
        "the local resource http://x.test/older.json declares $schema 'https://json-schema.org/draft/2019-09/schema': "
        "only 2020-12 documents are compiled (an older draft's keywords mean other things); convert it to 2020-12"
    )
