"""The generator against jsonschema, the reference implementation, on drawn schemas and instances:
every verdict must agree, and the predicate form (out=None) must agree with the full walk.

ENGRAM_SCHEMA_EXAMPLES=20000 pytest tests/codegen/test_differential_schemas.py runs a longer search."""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from codegen.standalone import validator_source
from tests.codegen.schema_grammar import VALUES, schemas

EXAMPLES = int(os.environ.get("ENGRAM_SCHEMA_EXAMPLES", "100"))
INSTANCES = 4  # per schema: 100 examples are 400 schema/instance pairs in the normal run


def compiled(schema: Any) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(validator_source(schema), "<schema>", "exec"), namespace)
    return namespace["check_document"]


@settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(schemas(), st.lists(VALUES, min_size=INSTANCES, max_size=INSTANCES))
def test_generated_validators_agree_with_jsonschema(schema: Any, instances: list[Any]) -> None:
    check = compiled(schema)
    oracle = jsonschema.Draft202012Validator(schema)
    for instance in instances:
        expected = oracle.is_valid(instance)
        problems: list[Any] = []
        verdict = check(instance, "", problems)
        assert verdict is expected, (json.dumps(schema), json.dumps(instance), problems)
        assert (problems == []) is expected
        assert check(instance, "", None) is expected
