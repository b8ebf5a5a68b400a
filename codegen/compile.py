"""Compile the checked schema into what the templates render: struct specs, validator functions (built
by codegen.validators, one small function per schema node, so the generated module reads like
hand-written code and a debugger steps through real lines), rule tables, CLI flags."""

from __future__ import annotations

import keyword
import math
from dataclasses import dataclass, field
from typing import Any

from codegen.index import SchemaIndex, escape, unescape
from codegen.load import SchemaError
from codegen.validators import ValidatorCompiler, is_rule, struct_rules

PY_TYPES = {"boolean": "bool", "integer": "int", "number": "float", "string": "str"}


@dataclass(frozen=True)
class FieldSpec:
    name: str
    kind: str
    annotation: str
    default: str | None  # Python source of the default, None when required
    schema_default: Any
    description: str
    env: tuple[str, ...]
    hash_exclude: str | None
    cli: str | None
    default_from: str | None
    older_names: tuple[str, ...] = ()  # names the field had before, still read (x-engram-older-names)
    nullable: bool = False  # its type is [kind, "null"]: null is a value of its own (dp_shared_memory: unresolved)
    vllm: tuple[str, ...] = ()  # the vLLM versions whose own EngramConfig has it (x-engram-vllm)


@dataclass(frozen=True)
class StructSpec:
    name: str
    pointer: str  # where the struct lives in the deployment document
    description: str
    fields: tuple[FieldSpec, ...]
    field_tests: dict[str, str]  # field -> a Python test of its value `{v}`: its JSON type, and bounds

    @property
    def field_test(self) -> str:
        """All of field_tests over a constructed instance (`self`), inline."""
        return " and ".join(f"({t.format(v='self.' + n)})" for n, t in self.field_tests.items()) or "True"

    @property
    def env_fields(self) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.fields if f.env)

    @property
    def integer_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.kind == "integer")

    @property
    def vllm_versions(self) -> dict[str, tuple[str, ...]]:
        """Each vLLM version (x-engram-vllm) -> the fields its own EngramConfig has, in schema order;
        versions in numeric order."""
        versions = sorted({v for f in self.fields for v in f.vllm}, key=lambda v: tuple(map(int, v.split("."))))
        return {v: tuple(f.name for f in self.fields if v in f.vllm) for v in versions}

    @property
    def older_names(self) -> dict[str, str]:
        """An older field name -> the field's name now."""
        return {old: f.name for f in self.fields for old in f.older_names}


@dataclass(frozen=True)
class RuleSpec:
    rule: str
    path: str
    message: str
    scope: str  # the struct the rule lives in, or "deployment"


@dataclass(frozen=True)
class FlagSpec:
    flag: str
    pointer: tuple[str, ...]
    kind: str
    help: str


@dataclass
class Compiled:
    structs: list[StructSpec] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)
    imports: list[str] = field(default_factory=list)  # the runtime helpers the validators call
    attr_rule_functions: dict[str, str] = field(default_factory=dict)  # struct -> check_<struct>_rules
    rules: list[RuleSpec] = field(default_factory=list)
    flags: list[FlagSpec] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)  # deployment key -> struct name
    field_checks: dict[str, dict[str, str]] = field(default_factory=dict)  # struct -> field -> its node's function
    platform: dict[str, Any] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)  # x-engram-checks: rule id -> the pointer it names

    @property
    def engram(self) -> StructSpec:
        return next(s for s in self.structs if s.name == "EngramConfig")


def compile_schema(document: dict[str, Any]) -> Compiled:
    out = Compiled()
    index = SchemaIndex(document)
    validators = ValidatorCompiler(document, index)
    root = validators.function("")
    out.rules = _rules(document, index)
    out.checks = {check["rule"]: check["path"] for check in document.get("x-engram-checks", [])}
    defs = document.get("$defs", {})
    for key, prop in document.get("properties", {}).items():
        ref = prop.get("$ref", "").removeprefix("#/$defs/") if isinstance(prop, dict) else ""
        if ref in defs and _is_struct(defs[ref]):
            out.sections[key] = ref
            out.field_checks[ref] = {
                fname: validators.function(f"/$defs/{ref}/properties/{escape(fname)}")
                for fname in defs[ref].get("properties", {})
            }
            out.structs.append(_struct(ref, f"/{key}", defs[ref]))
            out.flags.extend(_flags(defs[ref], (key,)))
            if defs[ref].get("allOf"):
                out.attr_rule_functions[ref] = struct_rules(ref, defs[ref])
        elif isinstance(prop, dict):
            out.flags.extend(_flags({"properties": {key: prop}}, ()))
            if key == "platform":
                out.platform = prop
    out.functions = [*validators.source(), f"check_document = {root}"]
    out.imports = validators.imports()
    if "EngramConfig" not in out.sections.values():
        raise SchemaError(
            "/properties/engram: the deployment needs an 'engram' section referring to $defs/EngramConfig"
        )
    return out


def _is_struct(schema: Any) -> bool:
    """A config section: a titled, closed object definition that a deployment property refers to. Any
    other definition is only validated, whatever its names."""
    return (
        isinstance(schema, dict)
        and "title" in schema
        and schema.get("type") == "object"
        and schema.get("additionalProperties") is False
    )


def _rules(document: dict[str, Any], index: SchemaIndex) -> list[RuleSpec]:
    """Every engram rule, for the docs: definitions first, then the deployment's own."""
    pointers = sorted(index.base, key=lambda p: not p.startswith("/$defs/"))
    rules = []
    for pointer in pointers:
        node = index.at(pointer)
        if not isinstance(node, dict) or "x-engram-rule" not in node:
            continue
        parts = pointer.split("/")
        scope = unescape(parts[2]) if parts[1:2] == ["$defs"] else "deployment"
        if is_rule(node):
            rules.append(RuleSpec(node["x-engram-rule"], node["x-engram-path"], node["x-engram-message"], scope))
        elif "x-engram-message" in node:
            rules.append(RuleSpec(node["x-engram-rule"], _doc_path(pointer), node["x-engram-message"], scope))
    for check in document.get("x-engram-checks", []):  # checked by code, documented here
        rules.append(RuleSpec(check["rule"], check["path"], check["description"], "deployment"))
    return rules


def _identifier(name: str, where: str) -> None:
    """Section and field names become Python names in the structs: only those that can, may."""
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise SchemaError(f"{where}: {name!r} names a config struct or field, so it must be a Python identifier")


def _struct(name: str, pointer: str, schema: dict[str, Any]) -> StructSpec:
    _identifier(name, f"/$defs/{name}")
    required = set(schema.get("required", []))
    fields = []
    for fname, prop in schema.get("properties", {}).items():
        _identifier(fname, f"/$defs/{name}/properties/{fname}")
        kind, nullable = _kind(prop.get("type", "any"), f"/$defs/{name}/properties/{fname}/type")
        annotation = {"object": "dict[str, Any]", "array": "list[Any]"}.get(kind, PY_TYPES.get(kind, "Any"))
        annotation = f"{annotation} | None" if nullable else annotation
        default_from = prop.get("x-engram-default-from")
        if default_from is not None and default_from not in schema.get("properties", {}):
            raise SchemaError(
                f"/$defs/{name}/properties/{fname}/x-engram-default-from: {default_from!r} is not a field of {name}"
            )
        if fname in required:
            default = None
        elif default_from is not None:
            annotation, default = f"{annotation} | None", "None"
        elif "default" not in prop:
            raise SchemaError(f"/$defs/{name}/properties/{fname}: an optional field needs a default")
        elif prop["default"] == {}:
            default = "msgspec.field(default_factory=dict)"
        else:
            default = repr(prop["default"])
        fields.append(
            FieldSpec(
                name=fname,
                kind=kind,
                annotation=annotation,
                default=default,
                schema_default=prop.get("default"),
                description=prop.get("description", ""),
                env=tuple(prop.get("x-engram-env", ())),
                hash_exclude=prop.get("x-engram-hash", {}).get("exclude"),
                cli=prop.get("x-engram-cli"),
                default_from=default_from,
                older_names=tuple(prop.get("x-engram-older-names", ())),
                nullable=nullable,
                vllm=tuple(prop.get("x-engram-vllm", ())),
            )
        )
    # Required fields first keeps the rendered struct readable; kw_only makes the order free.
    fields.sort(key=lambda f: f.default is not None)
    tests = {
        fname: _field_test(prop) or f"FIELD_CHECKS[{name!r}][{fname!r}]({{v}}, '', None)"
        for fname, prop in schema.get("properties", {}).items()
    }
    return StructSpec(
        name=name,
        pointer=pointer,
        description=schema.get("description", ""),
        fields=tuple(fields),
        field_tests=tests,
    )


# What a struct's constructor checks of each field (the rest, such as an enum of architectures, is for the
# validators and verify_* methods): its JSON type, and its bounds when they are finite numbers, which reach
# the code as literals. A field without a single such type goes through its compiled node (FIELD_CHECKS).
TYPE_TESTS = {
    "boolean": "({v} is True or {v} is False)",  # no call: the cheapest exact test of a bool
    "integer": "type({v}) is int",
    "number": "type({v}) in (int, float)",
    "string": "type({v}) is str",
    "object": "type({v}) is dict",
    "array": "type({v}) is list",
}


def _kind(types: Any, where: str) -> tuple[str, bool]:
    """A struct field's type: one JSON type name, or [name, "null"]; and whether null is allowed."""
    if isinstance(types, str):
        return types, False
    if isinstance(types, list) and len(types) == 2 and "null" in types and all(isinstance(t, str) for t in types):
        return next(t for t in types if t != "null"), True
    raise SchemaError(f"{where}: a config struct field has one type, or one type and null")


def _field_test(prop: Any) -> str | None:
    """A test of a value `{v}` against a field schema's type (or that type and null) and bounds, or None
    where the type is not one of TYPE_TESTS."""
    if not isinstance(prop, dict):
        return None
    try:
        kind, nullable = _kind(prop.get("type"), "")
    except SchemaError:
        return None
    if kind not in TYPE_TESTS:
        return None
    if nullable:
        return f"({{v}} is None or {TYPE_TESTS[kind]})"
    low, high = (
        bound if isinstance(bound, (int, float)) and not isinstance(bound, bool) and math.isfinite(bound) else None
        for bound in (prop.get("minimum"), prop.get("maximum"))
    )
    bounds = "".join((f"{low!r} <= " if low is not None else "", "{v}", f" <= {high!r}" if high is not None else ""))
    return TYPE_TESTS[kind] + (f" and {bounds}" if bounds != "{v}" else "")


def _flags(schema: dict[str, Any], prefix: tuple[str, ...]) -> list[FlagSpec]:
    return [
        FlagSpec(
            flag=prop["x-engram-cli"],
            pointer=(*prefix, fname),
            kind=prop.get("type", "any"),
            help=prop.get("description", ""),
        )
        for fname, prop in schema.get("properties", {}).items()
        if "x-engram-cli" in prop
    ]


def _doc_path(pointer: str) -> str:
    """The document path of a schema node, relative to its $defs entry: /$defs/X/properties/a -> /a."""
    parts = pointer.split("/")[1:]
    if parts[:1] == ["$defs"]:
        parts = parts[2:]
    return "".join(f"/{p}" for i, p in enumerate(parts) if not (i % 2 == 0 and p == "properties"))
