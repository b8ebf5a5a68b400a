"""The generator: meta-schema first, unknown keywords rejected, deterministic output, drift caught."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from codegen.__main__ import main as codegen_main
from codegen.check import check_schema
from codegen.compile import compile_schema
from codegen.load import ROOT, SCHEMA_PATH, SchemaError, load_schema
from codegen.render import OUTPUTS, compiles, diff, render, write

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def mutated(change: Any) -> dict[str, Any]:
    schema = copy.deepcopy(SCHEMA)
    change(schema)
    return schema


def cpu_offload(schema: dict[str, Any]) -> dict[str, Any]:
    return schema["$defs"]["EngramConfig"]["properties"]["cpu_offload"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: cpu_offload(s).update(minimun=1),
            "/$defs/EngramConfig/properties/cpu_offload/minimun: unknown keyword 'minimun' would be ignored; "
            "did you mean 'minimum'?",
        ),
        (lambda s: cpu_offload(s).update(maxitems=1), "did you mean 'maxItems'?"),
        (lambda s: cpu_offload(s).update({"x-engram-colour": "red"}), "x-engram-colour: unknown extension keyword"),
        (
            lambda s: cpu_offload(s).update({"x-other": 1}),
            "x-other: unknown extension keyword; only x-engram-* keys are compiled",
        ),
        (lambda s: cpu_offload(s).update(type="bool"), "fails the 2020-12 meta-schema"),
        (lambda s: cpu_offload(s).update(pattern="(unclosed"), "fails the 2020-12 meta-schema"),
        (lambda s: s["allOf"][0].pop("x-engram-message"), "/allOf/0: an if/then rule needs x-engram-message"),
        (lambda s: s["allOf"][0].pop("x-engram-rule"), "/allOf/0/x-engram-path: only an if/then rule"),
        (lambda s: s["allOf"][0].update(type="object"), "an if/then rule holds only if, then and its x-engram-* keys"),
        (lambda s: cpu_offload(s).update({"x-engram-hash": False}), 'write {"exclude": "<reason>"}'),
        (lambda s: cpu_offload(s).update({"x-engram-vllm": "yes"}), "x-engram-vllm: 'yes' is not a vLLM version"),
        (lambda s: cpu_offload(s).update({"x-engram-vllm": []}), "x-engram-vllm: list the vLLM versions whose"),
        (lambda s: cpu_offload(s).update({"x-engram-vllm": ["0.33", "0.33"]}), "x-engram-vllm: list the vLLM"),
        (
            lambda s: cpu_offload(s).update({"x-engram-hash": {"exclude": "no"}}),
            "cpu_offload/x-engram-hash: vLLM hashes its own fields (x-engram-vllm); drop the exclusion",
        ),
        (lambda s: s["x-engram-checks"][0].pop("path"), "/x-engram-checks/0: must hold exactly rule, path and"),
        (lambda s: s["x-engram-checks"][0].update(rule="Host Memory"), "/x-engram-checks/0/rule: 'Host Memory' is not"),
        (lambda s: s["x-engram-checks"][0].update(path="engram"), "/x-engram-checks/0/path: a JSON pointer"),
        (
            lambda s: s["properties"]["engram"].update({"$ref": "other.json#/x"}),
            "/properties/engram/$ref: remote reference 'other.json#/x' (resolves to "
            "'https://engram.dev/schema/other.json') is not supported",
        ),
        (lambda s: s["properties"]["engram"].update({"$ref": "#/$defs/Nowhere"}), "points at nothing"),
        (lambda s: s["properties"]["engram"].update({"$ref": "#missing"}), "names no $anchor or $dynamicAnchor"),
        (
            lambda s: cpu_offload(s).update({"x-engram-format-assertion": True}),
            "format assertion is chosen once, at the schema's root",
        ),
    ],
)
def test_refuses_what_would_be_wrong_or_ignored(change: Any, message: str) -> None:
    with pytest.raises(SchemaError) as exc:
        check_schema(mutated(change))
    assert message in str(exc.value)


def test_unknown_keywords_are_annotations_and_near_misses_are_refused() -> None:
    """The spec ignores unknown keywords; one that is a keyword misspelt is refused instead."""
    check_schema(mutated(lambda s: cpu_offload(s).update(array_of_schemas=[{"type": "null"}])))
    with pytest.raises(SchemaError, match="did you mean 'required'"):
        check_schema(mutated(lambda s: s["$defs"]["EngramConfig"].update(requried=["cpu_offload"])))


def test_older_draft_keywords_compile_to_nothing_with_a_warning() -> None:
    schema = mutated(lambda s: cpu_offload(s).update({"additionalItems": False, "$recursiveRef": "#"}))
    assert check_schema(schema) == [
        "/$defs/EngramConfig/properties/cpu_offload/additionalItems: 'additionalItems' is not a 2020-12 keyword, "
        "so it does nothing here; use items (after prefixItems)",
        "/$defs/EngramConfig/properties/cpu_offload/$recursiveRef: '$recursiveRef' is not a 2020-12 keyword, "
        "so it does nothing here; use $dynamicRef",
    ]
    assert compile_schema(schema).functions == compile_schema(SCHEMA).functions


def test_compile_refuses_loops_and_unknown_asserted_formats() -> None:
    looped = mutated(
        lambda s: s["$defs"].update(A={"allOf": [{"$ref": "#/$defs/B"}]}, B={"anyOf": [{"$ref": "#/$defs/A"}]})
    )
    looped["properties"]["a"] = {"$ref": "#/$defs/A"}
    check_schema(looped)
    with pytest.raises(SchemaError, match=r"^/\$defs/A: the schema applies itself to the same value again"):
        compile_schema(looped)
    descending = mutated(lambda s: s["$defs"].update(T={"properties": {"next": {"$ref": "#/$defs/T"}}}))
    descending["properties"]["t"] = {"$ref": "#/$defs/T"}
    compile_schema(descending)  # recursion that descends into the value ends
    asserted = mutated(lambda s: cpu_offload(s).update(format="colour"))
    asserted["x-engram-format-assertion"] = True
    with pytest.raises(SchemaError, match="cpu_offload/format: format 'colour' cannot be asserted; known: date, "):
        compile_schema(asserted)


def test_struct_names_must_be_identifiers() -> None:
    schema = mutated(
        lambda s: s["$defs"]["EngramConfig"]["properties"].update({"odd-name": {"type": "boolean", "default": False}})
    )
    with pytest.raises(
        SchemaError, match="'odd-name' names a config struct or field, so it must be a Python identifier"
    ):
        compile_schema(schema)


def test_odd_names_outside_structs_compile() -> None:
    """Names that are no identifiers, and strings with quotes and newlines, render to valid code."""
    schema = mutated(
        lambda s: s["$defs"].update({"is-string": {"type": "object", "required": ["quote'\"", "new\nline"]}})
    )
    schema["properties"]["odd"] = {"$ref": "#/$defs/is-string", "properties": {"a-b": True, "a_b": False}}
    check_schema(schema)
    outputs = render(load_schema(SCHEMA_PATH), compile_schema(schema))
    namespace: dict[str, Any] = {}
    exec(compile(outputs["engram/_generated/validators.py"], "validators.py", "exec"), namespace)
    problems: list[Any] = []
    namespace["check_document"]({"odd": {"quote'\"": 1, "new\nline": 2, "a-b": 3}}, "", problems)
    assert problems == []
    namespace["check_document"]({"odd": {"a_b": 1}}, "", problems)
    assert [(p.path, p.rule) for p in problems] == [
        ("/odd/a_b", "false"),
        ("/odd/quote'\"", "required"),
        ("/odd/new\nline", "required"),
    ]


def test_generated_code_that_does_not_compile_is_a_generator_bug() -> None:
    with pytest.raises(SchemaError, match=r"generator bug: the generated x.py does not compile \("):
        compiles("def broken(:\n", "x.py")


def test_missing_ruff_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    schema = load_schema()
    with pytest.raises(SchemaError, match="ruff is not installed"):
        render(schema, compile_schema(schema.document))


def test_cli_reports_schema_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutated(lambda s: cpu_offload(s).update({"$ref": "https://example.com/s.json"}))))
    assert codegen_main(["--schema", str(bad), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("codegen: /$defs/EngramConfig/properties/cpu_offload/$ref: remote reference")
    assert "Traceback" not in err


def test_hash_opt_out_compiles() -> None:
    """A field of engram's own opts out of the digest with a reason; vLLM's fields are hashed, each in the
    versions whose EngramConfig has it."""
    schema = mutated(
        lambda s: s["$defs"]["EngramConfig"]["properties"].update(
            placement_hint={"type": "boolean", "default": False, "x-engram-hash": {"exclude": "storage only"}}
        )
    )
    check_schema(schema)
    compiled = compile_schema(schema)
    properties = schema["$defs"]["EngramConfig"]["properties"]
    assert [f.name for f in compiled.engram.fields if f.hash_exclude] == [
        name for name, prop in properties.items() if "x-engram-hash" in prop
    ]
    assert "placement_hint" in [f.name for f in compiled.engram.fields if f.hash_exclude]
    assert compiled.engram.vllm_versions == {
        version: tuple(name for name, prop in properties.items() if version in prop.get("x-engram-vllm", ()))
        for version in ("0.32", "0.33", "0.34")
    }


def test_output_is_deterministic_and_headed() -> None:
    schema = load_schema()
    first = render(schema, compile_schema(schema.document))
    second = render(schema, compile_schema(schema.document))
    assert first == second
    assert set(first) == set(OUTPUTS) | {"engram/_generated/engram.schema.json"}
    for path, text in first.items():
        if path.endswith(".py"):
            assert text.startswith(
                f"# Generated by `python -m codegen` from schema/engram.schema.json (sha256 {schema.sha256})."
            )
            assert "Do not edit" in text.splitlines()[1]


def test_committed_output_is_current() -> None:
    schema = load_schema()
    assert diff(render(schema, compile_schema(schema.document))) == ""


def test_check_catches_a_hand_edit(tmp_path: Path) -> None:
    schema = load_schema()
    outputs = render(schema, compile_schema(schema.document))
    write(outputs, root=tmp_path)
    assert diff(outputs, root=tmp_path) == ""
    target = tmp_path / "engram/_generated/validators.py"
    target.write_text(target.read_text().replace('"dp_shared_memory requires cpu_offload=True"', '"edited by hand"'))
    stale = diff(outputs, root=tmp_path)
    assert stale.startswith("--- a/engram/_generated/validators.py\n+++ b/engram/_generated/validators.py\n")
    lines = stale.splitlines()
    assert any(line.startswith("-") and "edited by hand" in line for line in lines)
    assert any(line.startswith("+") and "dp_shared_memory requires cpu_offload=True" in line for line in lines)


def test_check_command_exit_codes(tmp_path: Path) -> None:
    """`python -m codegen --check` in a copy of the repo: 0 when current, 1 with a diff after an edit."""
    for name in ("codegen", "schema", "engram", "docs", "pyproject.toml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    cmd = [sys.executable, "-m", "codegen", "--check"]
    assert subprocess.run(cmd, cwd=tmp_path, capture_output=True, check=False, timeout=120).returncode == 0
    with (tmp_path / "docs/config.md").open("a") as f:
        f.write("hand edit\n")
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 1
    assert "-hand edit" in done.stdout and "make codegen" in done.stderr


def test_problems_placeholder_needs_a_ref_at_the_path() -> None:
    schema = mutated(lambda s: s["allOf"][0].update({"x-engram-message": "broken: {problems}"}))
    check_schema(schema)
    with pytest.raises(
        SchemaError, match=r"/allOf/0: \{problems\} needs the rule's `then` to hold a \$ref at its x-engram-path"
    ):
        compile_schema(schema)


def generated_names(document: dict[str, Any]) -> dict[str, str]:
    """Each generated validator function and constant of `document`, by name: its source."""
    out = {}
    for source in compile_schema(document).functions:
        match = re.match(r"def (\w+)|(\w+) = ", source)
        assert match is not None, source[:80]
        out[match.group(1) or match.group(2)] = source
    return out


def test_a_new_field_changes_only_what_is_about_it() -> None:
    """Names come from the schema node they check (never from their position), so a new field adds its
    own function and changes only its object's function and the constant listing the object's fields."""
    before = generated_names(SCHEMA)
    after = generated_names(
        mutated(
            lambda s: s["$defs"]["EngramConfig"]["properties"].update(
                new_flag={"type": "boolean", "default": False, "description": "A new flag."}
            )
        )
    )
    removed, added = set(before) - set(after), set(after) - set(before)
    changed = {name for name in set(before) & set(after) if before[name] != after[name]}
    (function,) = (name for name in added if name.startswith("_s_"))
    assert function.startswith("_s_EngramConfig_new_flag_")  # the field's own check
    (old_constant,), (new_constant,) = removed, added - {function}  # the object's field list, as a constant

    def fields(source: str) -> set[str]:
        return set(ast.literal_eval(source.split("frozenset(", 1)[1].rsplit(")", 1)[0]))

    assert fields(after[new_constant]) == fields(before[old_constant]) | {"new_flag"}
    assert len(changed) == 1 and all(name.startswith("_s_EngramConfig_") for name in changed)  # the object itself
    assert not any(re.fullmatch(r"_[sc]\d+", name) for name in after)  # no name from a position
