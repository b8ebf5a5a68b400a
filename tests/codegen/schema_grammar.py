"""Hypothesis strategies for JSON Schema 2020-12 documents over every keyword the generator compiles,
nested and combined, with boolean subschemas, odd property and definition names, and $ref/$anchor
references; and JSON instances that hit those names. Patterns are kept to the part of ECMA-262 where
Python's `re` (which jsonschema uses) agrees, so that any disagreement is the generator's."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from hypothesis import strategies as st

from codegen.index import escape

DRAFT = "https://json-schema.org/draft/2020-12/schema"
# Names that broke or could break a generator that derives identifiers or literals from them.
NAMES = [
    "a",
    "b",
    "a-b",
    "a_b",
    "item",
    "items",
    "all0",
    "allOf",
    "document",
    "check_document",
    "_s0",
    "v",
    "path",
    "out",
    "seen",
    "",
    "'",
    '"',
    "a\nb",
    "~/",
    "\\",
    "é",
]
ANCHORS = ["A", "node_1", "x-y"]
PATTERNS = ["^a", "b", "^[a-z]+$", "^.$", "\\d", "é", "^$", "a|_"]
TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]
NUMBERS = st.sampled_from([-2, -1, 0, 1, 2, 3, 4, 0.5, 1.5, 2.0, -0.5, 10])

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    NUMBERS,
    st.sampled_from(["", "a", "ab", "abc", "b1", "é", "xyz", "A", "7", "a_b"]),
    st.sampled_from(NAMES),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(NAMES), inner, max_size=4),
    ),
    max_leaves=10,
)

small = st.integers(0, 3)
names = st.lists(st.sampled_from(NAMES), min_size=0, max_size=3, unique=True)


def _one_key(key: str, value: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return value.map(lambda v: {key: v})


LEAF_KEYWORDS = [
    _one_key(
        "type", st.one_of(st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True))
    ),
    _one_key("const", VALUES),
    _one_key("enum", st.lists(VALUES, min_size=1, max_size=3)),
    _one_key("minimum", NUMBERS),
    _one_key("maximum", NUMBERS),
    _one_key("exclusiveMinimum", NUMBERS),
    _one_key("exclusiveMaximum", NUMBERS),
    _one_key("multipleOf", st.sampled_from([1, 2, 3, 0.5, 0.25, 1.5])),
    _one_key("minLength", small),
    _one_key("maxLength", small),
    _one_key("pattern", st.sampled_from(PATTERNS)),
    _one_key("format", st.sampled_from(["date", "email", "no-such-format"])),
    _one_key("minItems", small),
    _one_key("maxItems", small),
    _one_key("uniqueItems", st.booleans()),
    _one_key("minProperties", small),
    _one_key("maxProperties", small),
    _one_key("required", names),
    _one_key("dependentRequired", st.dictionaries(st.sampled_from(NAMES), names, max_size=2)),
    _one_key("minContains", small),
    _one_key("maxContains", small),
    _one_key("title", st.sampled_from(["t", "'\n\""])),
]


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in parts:
        merged.update(part)
    return merged


def leaves(refs: list[dict[str, str]]) -> st.SearchStrategy[Any]:
    keyword_sets = st.lists(st.one_of(*LEAF_KEYWORDS), min_size=0, max_size=3).map(_merge)
    options = [st.booleans(), keyword_sets]
    if refs:
        options.append(st.sampled_from(refs))
    return st.one_of(*options)


def composites(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    children = st.lists(inner, min_size=1, max_size=3)
    keyword = st.one_of(
        _one_key("properties", st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)),
        _one_key("patternProperties", st.dictionaries(st.sampled_from(PATTERNS), inner, max_size=2)),
        _one_key("additionalProperties", inner),
        _one_key("propertyNames", inner),
        _one_key("prefixItems", children),
        _one_key("items", inner),
        _one_key("contains", inner),
        _one_key("allOf", children),
        _one_key("anyOf", children),
        _one_key("oneOf", children),
        _one_key("not", inner),
        _one_key("if", inner),
        _one_key("then", inner),
        _one_key("else", inner),
        _one_key("dependentSchemas", st.dictionaries(st.sampled_from(NAMES), inner, max_size=2)),
        _one_key("unevaluatedProperties", inner),
        _one_key("unevaluatedItems", inner),
        *LEAF_KEYWORDS,
    )
    return st.lists(keyword, min_size=1, max_size=4).map(_merge)


def _ref(name: str) -> str:
    return "#" + quote("/$defs/" + escape(name), safe="/$~")


LIBRARY = "urn:engram:library"


def _library(draw: st.DrawFn, plain: st.SearchStrategy[Any]) -> dict[str, Any]:
    """A nested schema resource with its own $defs, referring inside itself by `#...` (so against its own
    $id), and reaching its item schema by $dynamicRef: whoever is outermost in the dynamic scope with a
    `$dynamicAnchor: "item"` decides what an item must be."""
    keyword = "$dynamicAnchor" if draw(st.booleans()) else "$anchor"
    return {
        "$id": LIBRARY,
        "$defs": {"item": {keyword: "item", "allOf": [draw(plain)]}, "extra": draw(plain)},
        "properties": {"x": {"$dynamicRef": "#item"}, "y": {"$ref": "#/$defs/extra"}},
        "items": {"$dynamicRef": "#item"},
    }


@st.composite
def schemas(draw: st.DrawFn) -> Any:
    """A whole document: definitions (some with anchors, maybe a nested resource with dynamic references
    and a root-level dynamic anchor that overrides its item schema), then a root that may refer to them."""
    def_names = draw(st.lists(st.sampled_from(NAMES), max_size=3, unique=True))
    plain = st.recursive(leaves([]), composites, max_leaves=4)
    defs: dict[str, Any] = {}
    anchors: list[str] = []
    refs: list[dict[str, str]] = []
    for name in def_names:
        node = draw(plain)
        refs.append({"$ref": _ref(name)})
        if isinstance(node, dict) and draw(st.booleans()):
            anchor = draw(st.sampled_from(ANCHORS))
            if anchor not in anchors:
                anchors.append(anchor)
                node = {**node, "$anchor": anchor}
                refs.append({"$ref": f"#{anchor}"})
        defs[name] = node
    library = draw(st.sampled_from([True, True, False]))
    if library:
        defs["library"] = _library(draw, plain)
        refs += [{"$ref": LIBRARY}, {"$ref": f"{LIBRARY}#/$defs/extra"}]
        if draw(st.sampled_from([True, False])):  # the root resource binds "item" first: it wins
            defs["override"] = {"$dynamicAnchor": "item", "allOf": [draw(plain)]}
            refs.append({"$dynamicRef": "#item"})
        else:  # a plain $ref to a dynamic anchor (jsonschema resolves it dynamically when one is outside)
            refs.append({"$ref": f"{LIBRARY}#item"})
    root = draw(st.one_of(st.booleans(), st.recursive(leaves(refs), composites, max_leaves=10)))
    if library and draw(st.sampled_from([True, True, False])):  # and the root uses the library itself
        root = {"allOf": [root, {"$ref": LIBRARY}]}
    if isinstance(root, bool):
        return root
    document = {"$schema": DRAFT, **root}
    if library:  # jsonschema leaves an anonymous root out of the dynamic scope (test_conformance says more)
        document["$id"] = "https://example.com/root.json"
    if defs:
        document["$defs"] = defs
    return document
