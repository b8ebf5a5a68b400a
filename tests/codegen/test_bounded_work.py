"""Bounded work (issue 23, item 2): too long or too repetitive a pattern is refused when the schema is
checked, with the reason, before anything compiles; a match that backtracks past its timeout is reported
as a problem, never a hang; patterns in instance data are checked without being kept; long required and
enum lists are constant lookups."""

from __future__ import annotations

import pytest

from codegen.load import SchemaError
from codegen.standalone import load_validator
from engram.validation.patterns import MATCH_SECONDS, bound_problem, compile_pattern, is_instance_pattern


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("a{10000000}", "a repeat of 10,000,000; at most 100,000"),
        ("(?:a{1000}){1000}", "counted repeats that expand to 1,00"),
        ("(?:a{65535}){65535}", "counted repeats that expand to"),
        ("x" * 5000, "a pattern of 5,000 characters; at most 4,096"),
    ],
)
def test_oversized_patterns_are_refused_with_the_reason(pattern: str, problem: str) -> None:
    assert (bound_problem(pattern) or "").startswith(problem)
    with pytest.raises(SchemaError, match="at /pattern: .* is too big a pattern to compile: " + problem[:20]):
        load_validator({"pattern": pattern})


@pytest.mark.parametrize(
    "pattern", ["a{10000}", "(?:a{100}){100}", r"\p{Letter}{3}", "[a{99999999}]", "^[a-z]+$", "x{2,}"]
)
def test_patterns_within_bounds_compile(pattern: str) -> None:
    assert bound_problem(pattern) is None
    assert compile_pattern(pattern) is not None


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"propertyNames": {"pattern": "(a|a)*$"}}, {"a" * 31 + "b": 1}),
        ({"patternProperties": {"(.*?,){11}P": {"type": "string"}}}, {"," * 26: 1}),
        ({"pattern": "(a|a)*$"}, "a" * 31 + "b"),
    ],
)
def test_catastrophic_backtracking_is_a_problem_not_a_hang(schema: dict, value: object) -> None:  # type: ignore[type-arg]
    [problem] = load_validator(schema)(value)
    assert problem.rule == "pattern-timeout"
    assert problem.message.endswith(
        f"on a string of {len(next(iter(value)) if isinstance(value, dict) else value)} characters ran past the "
        f"{MATCH_SECONDS:g} s that one validation's patterns may take"
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"propertyNames": {"pattern": "^k"}},
        {"patternProperties": {"^k": {"type": "string"}}},
        {"additionalProperties": {"pattern": "^v"}},
    ],
)
def test_the_matches_of_one_validation_share_one_budget(schema: dict, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    """Matches each well inside the limit still add up: a clock that moves 0.3 s a match runs out
    within the budget's fourth match, however many keys remain."""
    from engram.validation import patterns

    now = [0.0]

    def clock() -> float:
        now[0] += 0.3
        return now[0]

    monkeypatch.setattr(patterns.time, "monotonic", clock)
    found = load_validator(schema)({f"k{i}": "v" for i in range(100)})
    assert [p.rule for p in found] == ["pattern-timeout"]
    assert now[0] < 2.0  # it stopped at the budget, not after a hundred matches


def test_instance_patterns_are_checked_but_not_kept() -> None:
    before = compile_pattern.cache_info().currsize
    assert is_instance_pattern("^ab+$") and not is_instance_pattern("a{10000000}") and not is_instance_pattern("(")
    assert compile_pattern.cache_info().currsize == before
    check = load_validator({"format": "regex", "x-engram-format-assertion": True})
    assert [p.rule for p in check("a{10000000}")] == ["format"] and check("a{3}") == []


def test_long_required_and_enum_lists_are_constant_lookups() -> None:
    """A required or enum list longer than eight compiles to one lookup, not a test per name (100,000
    names once cost 1.6 GB); its verdicts are the per-name ones, and an enum's message stays short."""
    names = ["a~b/c", *(f"k{i}" for i in range(99))]
    check = load_validator({"required": names, "enum": [{"k0": i} for i in range(50)]})
    found = check({"k0": 3, "k1": 1})
    assert [p.path for p in found if p.rule == "required"][:2] == ["/a~0b~1c", "/k2"]
    assert len([p for p in found if p.rule == "required"]) == 98
    assert [p.message for p in found if p.rule == "enum"] == [
        "expected one of {'k0': 0}, {'k0': 1}, {'k0': 2}, {'k0': 3}, {'k0': 4}, {'k0': 5}, {'k0': 6}, "
        "{'k0': 7} and 42 more; got an object"
    ]
    enum = load_validator({"enum": [1, True, "x", None, 2.5, [1], {"a": 1}, 3, 4, 5]})
    verdicts = [enum(v) == [] for v in (1, 1.0, True, "x", None, [1], {"a": 1}, 0, False, 2, [True])]
    assert verdicts == [True, True, True, True, True, True, True, False, False, False, False]


def test_the_compiled_functions_have_a_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """$dynamicRef bindings compile one function per binding scope (3 KB of schema once made 26,621);
    past MAX_FUNCTIONS the schema is refused, naming the node where the budget ran out."""
    import codegen.validators

    schema = {"allOf": [{"minimum": n} for n in range(6)]}
    assert load_validator(schema)(2) != []
    monkeypatch.setattr(codegen.validators, "MAX_FUNCTIONS", 4)
    with pytest.raises(SchemaError, match=r"^/allOf/3: this schema needs more than 4 validator functions"):
        load_validator(schema)


def chain(n: int, **beside: object) -> dict:  # type: ignore[type-arg]
    """$defs d0 -> d1 -> ... -> dn by $ref, each link with `beside` too; dn an integer."""
    defs: dict[str, object] = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}", **beside} for i in range(n)}
    defs[f"d{n}"] = {"type": "integer"}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def test_a_chain_of_pure_refs_is_followed_at_compile_time_whatever_its_length() -> None:
    """A node that is only a $ref (with annotations) validates as its target: 2,000 links compile to one
    function and one call (they once hit Python's recursion limit at about 350, with advice to use $ref)."""
    validate = load_validator(chain(2000, description="a link"))
    assert validate(3) == []
    assert [p.message for p in validate("x")] == ["expected an integer; got the string 'x'"]


def test_a_long_chain_of_working_refs_is_refused_by_its_budget_not_the_stack() -> None:
    """Links that also check something are one Python frame each when a value is validated: past
    MAX_CHAIN the schema is refused with the limit named, at any length (no RecursionError)."""
    import codegen.validators

    limit = codegen.validators.MAX_CHAIN
    validate = load_validator(chain(limit - 1, minimum=0))
    assert validate(5) == [] and [p.rule for p in validate(-1)] == ["minimum"] * (limit - 1)
    for n in (limit + 1, 2000):
        with pytest.raises(SchemaError) as raised:
            load_validator(chain(n, minimum=0))
        assert str(raised.value).endswith(
            f": a chain of more than {limit} in-place references ($ref, allOf, ...) applies to one value; at most "
            "that many: shorten it (a node that is only a $ref costs nothing, it validates as its target)"
        )


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}},  # pure refs
        {"$ref": "#/$defs/a", "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"minimum": 1, "$ref": "#"}}},
    ],
)
def test_a_cycle_of_in_place_references_is_refused(schema: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(SchemaError, match=r"so validation would never end$"):
        load_validator(schema)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"minimum": 10**5000}, "/minimum: an integer of 16,610 bits is too large for a schema"),
        ({"const": [1, -(10**5000)]}, "/const/1: an integer of 16,610 bits is too large for a schema"),
        ({"properties": {1: {}}}, "/properties: the key '1' is not a string; JSON object keys are"),
        ({"const": {1, 2}}, "/const: a Python set is not a JSON value"),
        ({"enum": [b"x"]}, "/enum/0: a Python bytes is not a JSON value"),
    ],
)
def test_a_python_schema_that_is_no_json_value_is_one_schema_error(schema: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(SchemaError) as raised:
        load_validator(schema)
    assert str(raised.value) == message
