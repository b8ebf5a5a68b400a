"""Run by tests/codegen/test_hostile_strings.py in a child process: hypothesis draws hostile text for every
string position of a schema (names, descriptions, comments, enum and const values, defaults, examples,
$defs keys reached by $ref, engram's own keywords) and compiles and runs each schema; payloads write the
canary file named on the command line if any text ever became code. Prints the examples run."""

from __future__ import annotations

import sys
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen.index import escape
from codegen.load import SchemaError
from codegen.standalone import load_validator

CANARY = sys.argv[1]
RUN = f"__import__('pathlib').Path({CANARY!r}).write_text('ran')"
PAYLOADS = [
    f"'\n{RUN}\n'",
    f'"""\n{RUN}\n"""',
    f"')\n    {RUN}\n#",
    f"\n    {RUN}",
    f"{{{RUN}}}",
    "{value.__init__.__globals__}",
    "{value!r:>1000000000}",
    "{0}{problems}%s%r",
    "\\N{BULLET}\\x00\\",
    "#}}{{\u2028\x00",
]
PIECES = ["'", '"', "\\", "\n", "{", "}", "#", "%", " ", "\u2028", "\x00", "é", "N", "x", "    ", RUN]
HOSTILE = st.one_of(
    st.sampled_from(PAYLOADS),
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),  # pieces of quoting around a payload
)
examples = 0


def schema_with(s: list[str]) -> dict[str, Any]:
    """Every string position a 2020-12 schema has, each holding one drawn text."""
    return {
        "$comment": s[0],
        "title": s[1],
        "description": s[2],
        "type": "object",
        "properties": {
            s[3]: {"type": "string", "description": s[4], "default": s[5], "examples": [s[6]], "format": s[7]},
            "choice": {"enum": [s[8], 1, [s[9]]], "$comment": s[10]},
            "fixed": {"const": {s[11]: s[12]}},
            "ref": {"$ref": "#/$defs/" + quote(escape(s[13]), safe="")},
        },
        "required": [s[3]],
        "dependentRequired": {s[14]: [s[15]]},
        "$defs": {s[13]: {"const": s[16], "deprecated": True}},
        "propertyNames": {"not": {"const": s[17]}},
    }


def rule_with(s: list[str]) -> dict[str, Any]:
    """engram's own keywords, whose grammars may refuse the text (never run it)."""
    rule = {"if": True, "then": {"const": 1}, "x-engram-rule": s[18], "x-engram-message": s[19], "x-engram-path": ""}
    return {"allOf": [rule]}


@settings(max_examples=int(sys.argv[2]), deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(HOSTILE, min_size=20, max_size=20))
def compile_and_run(strings: list[str]) -> None:
    global examples
    validate = load_validator(schema_with(strings))  # any text is allowed in these positions
    instance = {strings[3]: 5, "choice": strings[8], "fixed": {strings[11]: strings[12]}, "ref": 0, strings[14]: 1}
    for problem in validate(instance):
        assert isinstance(problem.message, str) and len(problem.message) < 20_000
    try:
        ruled = load_validator(rule_with(strings))
    except SchemaError:
        pass  # refused by a grammar
    else:
        assert all(len(p.message) < 20_000 for p in ruled(2))
    examples += 1


compile_and_run()
print(examples)
