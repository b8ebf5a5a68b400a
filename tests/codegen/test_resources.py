"""Schemas spread over files (issue 23, item 5): a `$ref` to another document of the set, registered as a
local resource by URI or found in a directory, compiles, and every value gets jsonschema's verdict with
the same documents in its registry; a reference to anything not registered is still refused (nothing is
fetched), and the registry is bounded and checked like the schema itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from codegen.load import SchemaError
from codegen.resources import local_resources
from codegen.standalone import load_validator

SET = "http://schemas.test/set/"
RESOURCES: dict[str, Any] = {
    f"{SET}integer.json": {"type": "integer"},
    f"{SET}defs.json": {
        "$defs": {"positive": {"exclusiveMinimum": 0}, "label": {"$anchor": "label", "type": "string", "maxLength": 3}}
    },
    f"{SET}nested/first.json": {"$ref": "second.json"},  # relative to its own URI: nested/second.json
    f"{SET}nested/second.json": {"maximum": 10, "$ref": "../integer.json"},
    f"{SET}declared.json": {"$id": "http://other.test/named.json", "$defs": {"small": {"maximum": 2}}},
    f"{SET}tree.json": {
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {"data": True, "children": {"type": "array", "items": {"$dynamicRef": "#node"}}},
    },
    f"{SET}back.json": {"properties": {"self": {"$ref": "#"}}, "minProperties": 1},
    f"{SET}evaluated.json": {"properties": {"known": {"type": "boolean"}}},
}
CASES: list[tuple[dict[str, Any], list[Any]]] = [
    ({"$ref": f"{SET}integer.json"}, [1, "1", 1.5, None]),
    ({"properties": {"n": {"$ref": f"{SET}defs.json#/$defs/positive"}}}, [{"n": 1}, {"n": 0}, {"n": -2}]),
    ({"items": {"$ref": f"{SET}defs.json#label"}}, [["ab"], ["abcd"], [1]]),
    ({"$id": f"{SET}root.json", "$ref": "nested/first.json"}, [3, 11, 2.5, "x"]),
    ({"$ref": "http://other.test/named.json#/$defs/small"}, [1, 3]),  # by its own $id, registered too
    ({"$ref": f"{SET}declared.json#/$defs/small"}, [2, 5]),
    (  # one document reached by both its names: loaded once
        {"allOf": [{"$ref": "http://other.test/named.json#/$defs/small"}, {"$ref": f"{SET}declared.json"}]},
        [1, 3],
    ),
    (
        {
            "$id": f"{SET}strict.json",
            "$dynamicAnchor": "node",
            "$ref": "tree.json",
            "unevaluatedProperties": False,
        },
        [{"data": 1}, {"children": [{"data": 1}]}, {"children": [{"extra": 1}]}, {"extra": 1}],
    ),
    ({"$ref": f"{SET}back.json"}, [{"self": {"self": {"a": 1}}}, {"self": {}}, {}]),
    (
        {"allOf": [{"$ref": f"{SET}evaluated.json"}], "unevaluatedProperties": False},
        [{"known": True}, {"known": True, "other": 1}, {"known": 1}],
    ),
]


def jsonschema_verdict(schema: dict[str, Any], value: Any, resources: dict[str, Any]) -> bool:
    registry: Registry = Registry().with_resources(
        [(uri, DRAFT202012.create_resource(doc)) for uri, doc in resources.items()]
    )
    return bool(jsonschema.Draft202012Validator(schema, registry=registry).is_valid(value))


@pytest.mark.parametrize(("schema", "values"), CASES)
def test_references_into_local_resources_validate_as_jsonschema_does(schema: dict[str, Any], values: list[Any]) -> None:
    validate = load_validator(schema, RESOURCES)
    verdicts = [(value, validate(value) == []) for value in values]
    assert verdicts == [(value, jsonschema_verdict(schema, value, RESOURCES)) for value in values]
    assert {ok for _, ok in verdicts} == {True, False}  # each case tells valid from invalid


def test_a_directory_registers_each_file_by_its_path_and_its_id(tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    (tmp_path / "integer.json").write_text(json.dumps({"type": "integer"}))
    (tmp_path / "nested" / "first.json").write_text(json.dumps({"$ref": "../integer.json", "minimum": 0}))
    (tmp_path / "named.json").write_text(json.dumps({"$id": "urn:schemas:small", "maximum": 2}))
    (tmp_path / "notes.txt").write_text("not a schema, not read")
    found = local_resources(tmp_path, "http://localhost:1234/")
    assert sorted(found) == [
        "http://localhost:1234/integer.json",
        "http://localhost:1234/named.json",
        "http://localhost:1234/nested/first.json",
        "urn:schemas:small",
    ]
    validate = load_validator({"$ref": "http://localhost:1234/nested/first.json"}, found)
    assert [validate(v) == [] for v in (3, -1, "3")] == [True, False, False]
    assert load_validator({"$ref": "urn:schemas:small"}, tmp_path)(3)[0].rule == "maximum"  # the directory itself
    assert (tmp_path / "integer.json").resolve().as_uri() in local_resources(tmp_path)


@pytest.mark.parametrize(
    ("schema", "resources", "message"),
    [
        (
            {"$ref": "http://nowhere.test/x.json"},
            RESOURCES,
            "/$ref: remote reference 'http://nowhere.test/x.json' (resolves to 'http://nowhere.test/x.json') is not "
            "supported: the generator never fetches; embed the referenced schema under $defs with its $id, or "
            "register the document as a local resource under that URI",
        ),
        (
            {"$ref": f"{SET}bad.json"},
            {f"{SET}bad.json": {"minimum": "1"}},
            f"the local resource {SET}bad.json fails the 2020-12 meta-schema at /minimum: '1' is not of type 'number'",
        ),
        (
            {"$ref": f"{SET}loop.json"},
            {f"{SET}loop.json": {"$ref": f"{SET}loop.json"}},
            f"{SET}loop.json#: the schema applies itself to the same value again through in-place keywords ($ref, allOf, "
            "anyOf, ...), so validation would never end",
        ),
        (
            {"$ref": f"{SET}huge.json"},
            {f"{SET}huge.json": {"maximum": float("inf")}},
            f"the local resource '{SET}huge.json': /maximum: inf is not a JSON number (write a finite one)",
        ),
        (
            {},
            {"relative.json": {}},
            "a local resource's key 'relative.json' must be an absolute URI without a fragment",
        ),
        (
            {},
            {f"{SET}a.json#x": {}},
            f"a local resource's key '{SET}a.json#x' must be an absolute URI without a fragment",
        ),
        (
            {},
            {f"{SET}a.json": [1]},
            f"the local resource '{SET}a.json' is not a schema (an object or a boolean), it is list",
        ),
    ],
)
def test_bad_references_and_bad_resources_are_refused(schema: dict[str, Any], resources: Any, message: str) -> None:
    with pytest.raises(SchemaError) as raised:
        load_validator(schema, resources)
    assert str(raised.value) == message


def test_a_directory_is_bounded_and_its_files_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import codegen.resources

    (tmp_path / "a.json").write_text('{"type": "integer"}')
    (tmp_path / "b.json").write_text('{"type": ')
    with pytest.raises(SchemaError, match=r"b\.json: not a readable JSON document \(Expecting value"):
        dict(local_resources(tmp_path))  # reading them all reaches the bad one
    (tmp_path / "b.json").write_text(json.dumps({"$id": "http://x.test/b.json", "maxLength": 4}))
    (tmp_path / "c.json").write_text(json.dumps({"$id": "http://x.test/b.json", "maxLength": 5}))
    with pytest.raises(
        SchemaError, match=r"c\.json: two different documents are registered under 'http://x.test/b.json'"
    ):
        dict(local_resources(tmp_path))
    (tmp_path / "c.json").unlink()
    monkeypatch.setattr(codegen.resources, "MAX_DOCUMENTS", 3)  # a.json, b.json, and b.json's $id
    assert len(local_resources(tmp_path)) == 3
    (tmp_path / "d.json").write_text("{}")
    (tmp_path / "e.json").write_text("{}")
    with pytest.raises(SchemaError, match=r"more than 3 documents in"):
        local_resources(tmp_path)
    (tmp_path / "e.json").unlink()
    monkeypatch.setattr(codegen.resources, "MAX_FILE_BYTES", 10)
    with pytest.raises(SchemaError, match=r"a\.json: larger than 0 MiB"):
        load_validator({"$ref": (tmp_path / "a.json").absolute().as_uri()}, tmp_path)
    with pytest.raises(SchemaError, match=r"is not a directory of \*\.json schema documents"):
        local_resources(tmp_path / "a.json")
    with pytest.raises(SchemaError, match=r"base_uri 'http://x.test/dir' must end with '/'"):
        local_resources(tmp_path, "http://x.test/dir")


def test_a_directory_reads_only_what_is_referenced_and_only_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import codegen.resources

    outside = tmp_path / "outside.json"
    outside.write_text(json.dumps({"maximum": 0}))
    root = tmp_path / "set"
    root.mkdir()
    (root / "used.json").write_text(json.dumps({"type": "integer"}))
    (root / "link.json").symlink_to(outside)  # a document of the directory's name, from elsewhere
    (root / "sub").symlink_to(tmp_path, target_is_directory=True)
    for k in range(3):  # never referenced: never read, however large
        (root / f"unused-{k}.json").write_text(json.dumps({"description": "x" * (1 << 20)}))
    monkeypatch.setattr(codegen.resources, "MAX_TOTAL_BYTES", 1 << 20)
    assert load_validator({"$ref": (root / "used.json").absolute().as_uri()}, root)(3) == []
    with pytest.raises(SchemaError, match="pass 1 MiB in all"):  # an $id no path names: the rest are read, bounded
        load_validator({"$ref": "urn:nowhere"}, root)
    monkeypatch.setattr(codegen.resources, "MAX_TOTAL_BYTES", 64 << 20)
    with pytest.raises(SchemaError, match="remote reference"):  # not registered: the link is not followed
        load_validator({"$ref": (root / "link.json").absolute().as_uri()}, root)


def test_a_deep_directory_and_odd_paths_are_one_line_errors(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    for _ in range(1200):  # deeper than a path can name: made one level at a time, by descriptor
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    try:
        with pytest.raises(SchemaError, match="is more than 32 directories deep"):
            local_resources(tmp_path)
    finally:  # shrink it a level at a time: removing it whole would recurse past Python's limit
        while (tmp_path / "d" / "d").is_dir():
            (tmp_path / "d" / "d").rename(tmp_path / "up")
            (tmp_path / "d").rmdir()
            (tmp_path / "up").rename(tmp_path / "d")
    for odd in (7, b"/tmp", None):
        with pytest.raises(SchemaError, match="local resources are a mapping of URIs to documents or a directory"):
            local_resources(odd)  # type: ignore[arg-type]
