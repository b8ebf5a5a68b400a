"""Any JSON Schema 2020-12 document compiled on its own, outside a deployment: the module text, or a
loaded `check(value) -> problems`. The differential tests drive the compiler through this, and it is
how to try a schema before it goes into schema/engram.schema.json."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from codegen.check import check_schema
from codegen.index import SchemaIndex
from codegen.load import SchemaError, check_json_value, too_deep
from codegen.render import compiles, environment
from codegen.resources import Resources, local_resources
from codegen.validators import ValidatorCompiler
from engram.errors import Problem
from engram.validation.patterns import PatternTimeout, pattern_budget


def validator_source(schema: Any, resources: Resources | None = None) -> str:
    """Python source of a module whose `check_document(v, path, out)` validates against `schema`.
    `resources`: the schema set's other documents, by URI or as a directory (codegen.resources)."""
    if not isinstance(schema, dict | bool):
        raise SchemaError(f"a schema is an object or a boolean, not {type(schema).__name__} {json.dumps(schema)[:80]}")
    check_json_value(schema)
    local = local_resources(resources) if resources is not None else {}
    index = None
    try:
        index = SchemaIndex(schema, local)
        if isinstance(schema, dict):
            check_schema(schema, require_dialect=False, resources=local)
        compiler = ValidatorCompiler(schema, index)
        root = compiler.function("")
    except RecursionError:
        raise too_deep() from None
    except SchemaError as exc:
        if index is None or not index.origin:
            raise
        raise SchemaError(index.readable(str(exc))) from None
    text = (
        environment()
        .get_template("validators.py.j2")
        .render(
            sha256=hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest(),
            imports=compiler.imports(),
            functions=[*compiler.source(), f"check_document = {root}"],
            rule_structs=[],
            attr_rule_functions=[],
            field_checks={},
        )
    )
    return compiles(text, "<schema>")


def load_validator(schema: Any, resources: Resources | None = None) -> Callable[[Any], list[Problem]]:
    """`check(value)`: every problem `value` has against `schema` (whose references may reach the local
    `resources`), [] when it is valid."""
    namespace: dict[str, Any] = {}
    exec(compile(validator_source(schema, resources), "<schema>", "exec"), namespace)
    check = namespace["check_document"]

    def problems(value: Any) -> list[Problem]:
        found: list[Problem] = []
        try:
            with pattern_budget():
                check(value, "", found)
        except PatternTimeout as exc:  # reported, never a hang
            found.append(Problem("", "pattern-timeout", str(exc)))
        return found

    return problems
