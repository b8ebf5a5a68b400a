"""Compile the checked schema into what the templates render: struct specs, validator functions,
rule tables, CLI flags. Validator code is built here as text, one small function per schema node, so
the generated module reads like hand-written code and a debugger steps through real lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from codegen.load import SchemaError

PY_TYPES = {"boolean": "bool", "integer": "int", "number": "float", "string": "str"}
TYPE_TESTS = {
    "object": "isinstance({v}, dict)",
    "array": "isinstance({v}, list)",
    "string": "isinstance({v}, str)",
    "boolean": "isinstance({v}, bool)",
    "integer": "_is_integer({v})",
    "number": "_is_number({v})",
    "null": "{v} is None",
}
TYPE_NAMES = {
    "object": "an object",
    "array": "an array",
    "string": "a string",
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "null": "null",
}


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


@dataclass(frozen=True)
class StructSpec:
    name: str
    pointer: str  # where the struct lives in the deployment document
    description: str
    fields: tuple[FieldSpec, ...]

    @property
    def env_fields(self) -> tuple[FieldSpec, ...]:
        return tuple(f for f in self.fields if f.env)

    @property
    def integer_fields(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.kind == "integer")


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
    attr_rule_functions: dict[str, str] = field(default_factory=dict)  # struct -> check_<struct>_rules
    rules: list[RuleSpec] = field(default_factory=list)
    flags: list[FlagSpec] = field(default_factory=list)
    sections: dict[str, str] = field(default_factory=dict)  # deployment key -> struct name
    platform: dict[str, Any] = field(default_factory=dict)

    @property
    def engram(self) -> StructSpec:
        return next(s for s in self.structs if s.name == "EngramConfig")


def compile_schema(document: dict[str, Any]) -> Compiled:
    out = Compiled()
    compiler = _ValidatorCompiler(out)
    defs = document.get("$defs", {})
    for name, schema in defs.items():
        compiler.function(schema, f"check_{name}", f"/$defs/{name}", scope=name)
    compiler.function(document, "check_document", "", scope="deployment")
    for key, prop in document.get("properties", {}).items():
        ref = prop.get("$ref", "").removeprefix("#/$defs/")
        if ref in defs and "title" in defs[ref]:
            out.sections[key] = ref
            out.structs.append(_struct(ref, f"/{key}", defs[ref]))
            out.flags.extend(_flags(defs[ref], (key,)))
            if defs[ref].get("allOf"):
                out.attr_rule_functions[ref] = compiler.attr_rules(ref, defs[ref])
        else:
            out.flags.extend(_flags({"properties": {key: prop}}, ()))
            if key == "platform":
                out.platform = prop
    if "EngramConfig" not in out.sections.values():
        raise SchemaError(
            "/properties/engram: the deployment needs an 'engram' section referring to $defs/EngramConfig"
        )
    return out


def _struct(name: str, pointer: str, schema: dict[str, Any]) -> StructSpec:
    required = set(schema.get("required", []))
    fields = []
    for fname, prop in schema.get("properties", {}).items():
        kind = prop.get("type", "any")
        annotation = {"object": "dict[str, Any]", "array": "list[Any]"}.get(kind, PY_TYPES.get(kind, "Any"))
        default_from = prop.get("x-engram-default-from")
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
            )
        )
    # Required fields first keeps the rendered struct readable; kw_only makes the order free.
    fields.sort(key=lambda f: f.default is not None)
    return StructSpec(name=name, pointer=pointer, description=schema.get("description", ""), fields=tuple(fields))


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


def _ident(text: str) -> str:
    return re.sub(r"\W", "_", text)


class _ValidatorCompiler:
    def __init__(self, out: Compiled) -> None:
        self.out = out
        self.predicates: dict[str, str] = {}  # expression -> function name

    # -- walkers: report every problem ---------------------------------------------------------

    def function(self, schema: dict[str, Any], name: str, pointer: str, scope: str) -> str:
        lines = [
            f"def {name}(v: Any, path: str, out: list[Problem]) -> None:",
            f'    """Schema node {pointer or "/"}."""',
        ]
        rule = schema.get("x-engram-rule")
        message = schema.get("x-engram-message")
        if rule and message and "if" not in schema:
            self.out.rules.append(RuleSpec(rule, _doc_path(pointer), message, scope))

        def problem(rule_id: str, expected: str) -> str:
            text = _message_expr(message, "v") if message else f"{'expected ' + expected!r} + _got(v)"
            return f"out.append(Problem(path, {rule or rule_id!r}, {text}))"

        kind = schema.get("type")
        if kind:
            lines += [
                f"    if not {TYPE_TESTS[kind].format(v='v')}:",
                f"        {problem('type', TYPE_NAMES[kind])}",
                "        return",
            ]
        if "$ref" in schema:
            lines.append(f"    check_{schema['$ref'].removeprefix('#/$defs/')}(v, path, out)")
        if "const" in schema:
            lines += [
                f"    if not {_equals('v', schema['const'])}:",
                f"        {problem('const', _json_text(schema['const']))}",
            ]
        if "enum" in schema:
            choices = ", ".join(_json_text(c) for c in schema["enum"])
            lines += [
                f"    if not ({' or '.join(_equals('v', c) for c in schema['enum'])}):",
                f"        {problem('enum', 'one of ' + choices)}",
            ]
        for key, op, word in (("minimum", "<", ">="), ("maximum", ">", "<=")):
            if key in schema:
                guard = "" if kind in ("integer", "number") else "_is_number(v) and "
                lines += [
                    f"    if {guard}v {op} {schema[key]!r}:",
                    f"        {problem(key, f'{word} {schema[key]}')}",
                ]
        self._array(schema, name, pointer, scope, lines, problem, kind)
        self._object(schema, name, pointer, scope, lines, problem, kind)
        for i, sub in enumerate(schema.get("allOf", [])):
            if "if" in sub:
                self._rule(sub, f"{pointer}/allOf/{i}", scope, lines)
            else:
                child = self.function(sub, f"{name}_all{i}", f"{pointer}/allOf/{i}", scope)
                lines.append(f"    {child}(v, path, out)")
        if "anyOf" in schema:
            tests = " or ".join(self.predicate(s) + "(v)" for s in schema["anyOf"])
            lines += [f"    if not ({tests}):", f"        {problem('any-of', 'one of the allowed forms')}"]
        if "not" in schema:
            lines += [
                f"    if {self.predicate(schema['not'])}(v):",
                f"        {problem('not', 'not this form')}",
            ]
        if "if" in schema:
            self._rule(schema, pointer, scope, lines)
        if len(lines) == 2:
            lines.append("    return")
        self.out.functions.append("\n".join(lines))
        return name

    def _array(self, schema, name, pointer, scope, lines, problem, kind) -> None:  # type: ignore[no-untyped-def]
        guard = "" if kind == "array" else "isinstance(v, list) and "
        if "minItems" in schema:
            n = schema["minItems"]
            lines += [f"    if {guard}len(v) < {n}:", f"        {problem('min-items', f'at least {n} item(s)')}"]
        if "maxItems" in schema:
            n = schema["maxItems"]
            lines += [f"    if {guard}len(v) > {n}:", f"        {problem('max-items', f'at most {n} item(s)')}"]
        if schema.get("uniqueItems"):
            lines += [f"    if {guard}not _unique(v):", f"        {problem('unique-items', 'distinct items')}"]
        if "items" in schema:
            child = self.function(schema["items"], f"{name}_item", f"{pointer}/items", scope)
            indent = "    "
            if guard:
                lines.append("    if isinstance(v, list):")
                indent = "        "
            lines += [f"{indent}for i, item in enumerate(v):", f'{indent}    {child}(item, f"{{path}}/{{i}}", out)']

    def _object(self, schema, name, pointer, scope, lines, problem, kind) -> None:  # type: ignore[no-untyped-def]
        keys = [k for k in ("required", "properties", "additionalProperties") if k in schema]
        if not keys:
            return
        indent = "    "
        if kind != "object":
            lines.append("    if isinstance(v, dict):")
            indent = "        "
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            lines += [
                f"{indent}if {key!r} not in v:",
                f'{indent}    out.append(Problem(path + {"/" + _escape(key)!r}, "required", "missing required field {key}"))',
            ]
        if schema.get("additionalProperties") is False:
            known = ", ".join(props)
            lines += [
                f"{indent}for key in sorted(v.keys() - {{{', '.join(repr(k) for k in props)}}}):",
                f'{indent}    out.append(Problem(path + "/" + _escape(key), "unknown-field", '
                f'f"unknown field {{_shown(key)!r}}; known fields: {known}"))',
            ]
        for key, sub in props.items():
            child = self.function(sub, f"{name}_{_ident(key)}", f"{pointer}/properties/{key}", scope)
            lines += [
                f"{indent}if {key!r} in v:",
                f"{indent}    {child}(v[{key!r}], path + {'/' + _escape(key)!r}, out)",
            ]

    def _rule(self, schema: dict[str, Any], pointer: str, scope: str, lines: list[str]) -> None:
        rel = schema["x-engram-path"]
        parts = tuple(_unescape(p) for p in rel.split("/")[1:])
        problems = None
        if "{problems}" in schema["x-engram-message"]:
            # The definition the rule's `then` requires at x-engram-path says which fields broke it, and how.
            ref = _schema_at(schema["then"], parts).get("$ref", "").removeprefix("#/$defs/")
            if not ref:
                raise SchemaError(
                    f"{pointer}: {{problems}} needs the rule's `then` to hold a $ref at its x-engram-path"
                )
            problems = f"_details(check_{ref}, _at(v, {parts!r}))"
        message = _message_expr(schema["x-engram-message"], f"_at(v, {parts!r})", problems)
        lines += [
            f"    # rule {schema['x-engram-rule']}",
            f"    if {self.predicate(schema['if'])}(v) and not {self.predicate(schema['then'])}(v):",
            f"        out.append(Problem(path + {rel!r}, {schema['x-engram-rule']!r}, {message}))",
        ]
        self.out.rules.append(RuleSpec(schema["x-engram-rule"], rel, schema["x-engram-message"], scope))

    # -- predicates: the same keywords as booleans, for if/then/anyOf/not ------------------------

    def predicate(self, schema: dict[str, Any]) -> str:
        """The name of a function true when its argument matches `schema`; rules that share a condition
        share one function."""
        body = _expr(schema, "v")
        if body not in self.predicates:
            self.predicates[body] = f"_matches_{len(self.predicates) + 1}"
            self.out.functions.append(f"def {self.predicates[body]}(v: Any) -> bool:\n    return {body}")
        return self.predicates[body]

    def attr_rules(self, struct: str, schema: dict[str, Any]) -> str:
        """Rules of one struct evaluated on its resolved instance: every field is present, so the
        JSON presence tests fall away and each rule is a few attribute reads (the fast path)."""
        lines = [
            f"def check_{struct}_rules(c: {struct}, path: str, out: list[Problem]) -> None:",
            f'    """The if/then rules of {struct}, on a resolved instance."""',
        ]
        for sub in schema["allOf"]:
            if "if" not in sub:
                raise SchemaError(f"/$defs/{struct}/allOf: only if/then rules may sit beside a struct's fields")
            rel = sub["x-engram-path"]
            field_name = rel.removeprefix("/")
            message = _message_expr(sub["x-engram-message"], f"c.{field_name}")
            lines += [
                f"    if ({_attr_expr(sub['if'], struct)}) and not ({_attr_expr(sub['then'], struct)}):",
                f"        out.append(Problem(path + {rel!r}, {sub['x-engram-rule']!r}, {message}))",
            ]
        return "\n".join(lines)


def _expr(schema: dict[str, Any], v: str) -> str:
    """A Python boolean expression that is true exactly when `v` is valid against `schema`."""
    terms: list[str] = []
    kind = schema.get("type")
    if kind:
        terms.append(TYPE_TESTS[kind].format(v=v))
    if "$ref" in schema:
        terms.append(f"_passes(check_{schema['$ref'].removeprefix('#/$defs/')}, {v})")
    if "const" in schema:
        terms.append(_equals(v, schema["const"]))
    if "enum" in schema:
        terms.append("(" + " or ".join(_equals(v, c) for c in schema["enum"]) + ")")
    if "minimum" in schema:
        terms.append(f"(not _is_number({v}) or {v} >= {schema['minimum']!r})")
    if "maximum" in schema:
        terms.append(f"(not _is_number({v}) or {v} <= {schema['maximum']!r})")
    if "minItems" in schema:
        terms.append(f"(not isinstance({v}, list) or len({v}) >= {schema['minItems']})")
    if "maxItems" in schema:
        terms.append(f"(not isinstance({v}, list) or len({v}) <= {schema['maxItems']})")
    if schema.get("uniqueItems"):
        terms.append(f"(not isinstance({v}, list) or _unique({v}))")
    if "items" in schema:
        terms.append(f"(not isinstance({v}, list) or all({_expr(schema['items'], 'x')} for x in {v}))")
    if "required" in schema:
        present = " and ".join(f"{k!r} in {v}" for k in schema["required"])
        terms.append(f"(not isinstance({v}, dict) or ({present}))")
    props = schema.get("properties", {})
    for key, sub in props.items():
        terms.append(f"(not isinstance({v}, dict) or {key!r} not in {v} or {_expr(sub, f'{v}[{key!r}]')})")
    if schema.get("additionalProperties") is False:
        terms.append(f"(not isinstance({v}, dict) or {v}.keys() <= {{{', '.join(repr(k) for k in props)}}})")
    for sub in schema.get("allOf", []):
        terms.append(_expr(sub, v))
    if "anyOf" in schema:
        terms.append("(" + " or ".join(_expr(s, v) for s in schema["anyOf"]) + ")")
    if "not" in schema:
        terms.append(f"not ({_expr(schema['not'], v)})")
    if "if" in schema:
        terms.append(f"(not ({_expr(schema['if'], v)}) or ({_expr(schema['then'], v)}))")
    return " and ".join(terms) if terms else "True"


def _attr_expr(schema: dict[str, Any], struct: str) -> str:
    allowed = {"properties", "required"}
    if set(schema) - allowed:
        raise SchemaError(f"/$defs/{struct}: struct rules may use only properties and required, got {sorted(schema)}")
    terms = []
    for key, sub in schema.get("properties", {}).items():
        if set(sub) - {"const", "enum", "minimum", "maximum"}:
            raise SchemaError(
                f"/$defs/{struct}: struct rules compare fields with const, enum, minimum or maximum only, got {sorted(sub)}"
            )
        # The instance is resolved (typed), so a bound compares the field directly.
        if "minimum" in sub:
            terms.append(f"c.{key} >= {sub['minimum']!r}")
        if "maximum" in sub:
            terms.append(f"c.{key} <= {sub['maximum']!r}")
        if "const" in sub:
            terms.append(_equals(f"c.{key}", sub["const"]))
        if "enum" in sub:
            terms.append("(" + " or ".join(_equals(f"c.{key}", e) for e in sub["enum"]) + ")")
    return " and ".join(terms) or "True"


def _equals(v: str, const: Any) -> str:
    """JSON equality: true/false are not 1/0, and 1 equals 1.0."""
    if isinstance(const, bool):
        return f"{v} is {const}"
    if isinstance(const, str):
        return f"{v} == {const!r}"
    return f"_json_equal({v}, {const!r})"


def _json_text(value: Any) -> str:
    return repr(value) if not isinstance(value, bool) else str(value).lower()


def _message_expr(message: str, value: str, problems: str | None = None) -> str:
    """The message with its placeholders filled: {value!r} (the offending value) and {problems}."""
    arguments = []
    if "{value" in message:
        arguments.append(f"value=_shown({value})")
    if "{problems}" in message:
        arguments.append(f"problems={problems}")
    return f"{message!r}.format({', '.join(arguments)})" if arguments else repr(message)


def _schema_at(schema: dict[str, Any], parts: tuple[str, ...]) -> dict[str, Any]:
    """The subschema that `properties` nesting places at document path `parts` ({} where there is none)."""
    for part in parts:
        schema = schema.get("properties", {}).get(part, {})
    return schema


def _doc_path(pointer: str) -> str:
    """The document path of a schema node, relative to its $defs entry: /$defs/X/properties/a -> /a."""
    parts = pointer.split("/")[1:]
    if parts[:1] == ["$defs"]:
        parts = parts[2:]
    return "".join(f"/{p}" for i, p in enumerate(parts) if not (i % 2 == 0 and p == "properties"))


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _unescape(part: str) -> str:
    return part.replace("~1", "/").replace("~0", "~")
