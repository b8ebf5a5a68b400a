"""Schema text never becomes code (issue 23, item 1): engram's own keywords have grammars checked before
anything compiles, message templates may use only {value!r} and {problems}, and descriptions reach
docstrings escaped. Every attempt runs where it would execute (the standalone validator, or the generated
structs module imported in a child process) with a canary file that must not appear."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen.check import check_schema
from codegen.compile import compile_schema
from codegen.load import SCHEMA_PATH, LoadedSchema, SchemaError
from codegen.render import render
from codegen.standalone import load_validator

SCHEMA = json.loads(SCHEMA_PATH.read_text())


def payload(canary: Path) -> str:
    return f"__import__('pathlib').Path({str(canary)!r}).write_text('ran')"


def rule(**overrides: Any) -> dict[str, Any]:
    return {"if": True, "then": True, "x-engram-rule": "r", "x-engram-message": "m", "x-engram-path": ""} | overrides


def field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return schema["$defs"]["EngramConfig"]["properties"][name]  # type: ignore[no-any-return]


def import_generated(schema: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Render `schema` with the full generator and import its structs module in a child process."""
    check_schema(schema)
    text = render(LoadedSchema(SCHEMA_PATH, schema, "0" * 64), compile_schema(schema))
    package = tmp_path / "generated_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "structs.py").write_text(text["engram/_generated/structs.py"])
    code = "import generated_package.structs as s; print(s.EngramConfig.__doc__)"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            rule(**{"x-engram-rule": "r\n    __import__('os').system('id')"}),
            r"/x-engram-rule: \"r\\n    __import__\('os'\).system\('id'\)\" is not a rule id",
        ),
        (rule(**{"x-engram-rule": "R1"}), "is not a rule id"),
        (rule(**{"x-engram-rule": "x" * 65}), "is not a rule id"),
        (rule(**{"x-engram-message": "{value.__init__.__globals__}"}), "is not a placeholder a message may use"),
        (rule(**{"x-engram-message": "{value!r:>1000000000}"}), "'{value!r:>1000000000}' is not a placeholder"),
        (rule(**{"x-engram-message": "{value!s}"}), "'{value!s}' is not a placeholder"),
        (rule(**{"x-engram-message": "{0}"}), "'{0}' is not a placeholder"),
        (rule(**{"x-engram-message": "{value[0]}"}), "'{value\\[0\\]}' is not a placeholder"),
        (rule(**{"x-engram-message": "unbalanced {"}), "not a message template .*write literal braces as {{ and }}"),
        (rule(**{"x-engram-message": "x" * 5000}), "a message of 5,000 characters; at most 4,096"),
    ],
)
def test_hostile_rules_are_refused_before_compiling(node: dict[str, Any], message: str, tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=message):
        load_validator(node)


def test_a_message_with_literal_braces_and_both_placeholders_compiles() -> None:
    check = load_validator(rule(then=False, **{"x-engram-message": "got {value!r}, want {{a}}; {value}"}))
    [problem] = check({"k": 1})
    assert (problem.rule, problem.message) == ("r", "got {'k': 1}, want {a}; {'k': 1}")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("x-engram-env", ['A"""; import os'], "is not an environment variable name"),
        ("x-engram-env", ["lower"], "is not an environment variable name"),
        ("x-engram-default-from", "cpu_offload or __import__('os')", "is not a field name"),
        ("x-engram-cli", "--x'); import os #", "is not a command-line flag"),
    ],
)
def test_hostile_extension_values_are_refused(key: str, value: Any, message: str) -> None:
    schema = copy.deepcopy(SCHEMA)
    field(schema, "cpu_offload")[key] = value
    with pytest.raises(SchemaError, match=message):
        check_schema(schema)


def test_default_from_must_name_a_sibling_field() -> None:
    schema = copy.deepcopy(SCHEMA)
    field(schema, "file_backed")["x-engram-default-from"] = "nope"
    with pytest.raises(SchemaError, match="x-engram-default-from: 'nope' is not a field of EngramConfig"):
        compile_schema(schema)


def test_a_description_cannot_end_its_docstring(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    schema = copy.deepcopy(SCHEMA)
    hostile = f'"""\n{payload(canary)}\n"""\\N{{BULLET}} \\x00 \u2028 "'
    schema["$defs"]["EngramConfig"]["description"] = hostile
    field(schema, "cpu_offload")["description"] = hostile
    done = import_generated(schema, tmp_path)
    assert done.returncode == 0, done.stderr
    assert not canary.exists()
    # the docstring holds the text itself (Python 3.13 strips docstrings' common indentation: compare lines)
    assert [line.strip() for line in done.stdout.splitlines()] == [
        line.strip() for line in (hostile + "\n").splitlines()
    ]


@settings(max_examples=40, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(['"', "'", "\\", "\n", "{", "}", "N", "x", "#", " ", "\u2028", "é", "\x00"]),
        max_size=40,
    )
)
def test_any_description_round_trips_through_the_docstring(text: str) -> None:
    from codegen.render import docstring_text

    namespace: dict[str, Any] = {}
    exec(compile(f'x = """{docstring_text(text)}"""', "<docstring>", "exec"), namespace)
    assert namespace["x"] == text
