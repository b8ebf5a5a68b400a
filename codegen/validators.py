"""Compile JSON Schema 2020-12 nodes to straight-line Python, one function per node and variant.

A node function is `f(v, path, out) -> bool`. With `out` a list it appends a Problem for every
violation and returns whether `v` is valid; with `out=None` it is a predicate that returns at the
first violation (anyOf, oneOf, not, if and contains ask that way). Where an `unevaluated*` keyword
needs them, a variant takes a fourth argument, the set that collects evaluated property names or item
indices. `$dynamicRef` is resolved here: a variant carries the outermost `$dynamicAnchor` binding of
each name in its dynamic scope, so every call has one fixed target.

Names come from what they check, so that a change to one node of the schema renames nothing else:
a function is `_s_<slug>_<digest>` (the slug readable from the end of its JSON pointer, the digest of the
pointer and variant), a constant `_c_<digest>` of its expression. Slugs hold only [A-Za-z0-9_] and a
clash of digests is refused, so names cannot collide, and every string from the schema reaches the code
through repr()."""

from __future__ import annotations

import hashlib
import re
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import urldefrag

from codegen.index import SchemaIndex, escape, unescape
from codegen.load import SchemaError
from engram.validation.string_formats import CHECKS as FORMAT_CHECKS

TYPE_TESTS = {
    "object": "isinstance(v, dict)",
    "array": "isinstance(v, list)",
    "string": "isinstance(v, str)",
    "boolean": "isinstance(v, bool)",
    "integer": "_is_integer(v)",
    "number": "_is_number(v)",
    "null": "v is None",
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
# Helpers the generated code may call, and where they live.
HELPERS = {
    "engram.validation.json_values": (
        "_at",
        "_details",
        "_escape",
        "_got",
        "_is_integer",
        "_is_number",
        "_json_equal",
        "_multiple_of",
        "_shown",
        "_unique",
        "_key",
    ),
    "engram.validation.patterns": ("compile_pattern", "pattern_search"),
    "engram.validation.string_formats": ("format_check",),
}


FORMAT_ASSERTION = "https://json-schema.org/draft/2020-12/vocab/format-assertion"
LOOKUP_FROM = 8  # a required or enum list longer than this compiles to a constant lookup
# The compiled functions a schema may need: engram's takes 132; the bound stops a few kilobytes of
# $dynamicRef bindings from compiling tens of thousands (seconds and hundreds of MB) before any use.
MAX_FUNCTIONS = 5_000
# In-place calls ($ref, allOf, ...) nest one Python frame each when a value is validated; engram's schema
# needs 2. Pure-$ref links are followed at compile time and cost none.
MAX_CHAIN = 200
# Keywords beside a $ref that change nothing a validator does: such a node validates as its target.
ALIAS_KEYS = {
    "$ref",
    "$comment",
    "$defs",
    "$anchor",
    "$schema",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
}


@dataclass(frozen=True)
class Variant:
    pointer: str
    annotate: bool  # takes the `ev` set of evaluated names or indices
    bindings: tuple[tuple[str, str], ...]  # $dynamicAnchor name -> pointer, outermost first wins


SLUG_CHARS = 40  # of the pointer's end, in a function's name: enough to tell a field at a glance


def digest(text: str) -> str:
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()[:10]


def function_name(key: Variant) -> str:
    """A node function's name: the end of its pointer, readable, then a digest of the whole variant."""
    slug = re.sub(r"[^0-9A-Za-z_]+", "_", unescape_slug(key.pointer)).strip("_")[-SLUG_CHARS:].strip("_")
    variant = repr((key.pointer, key.annotate, key.bindings))
    return f"_s_{slug}_{digest(variant)}" if slug else f"_s_{digest(variant)}"


def unescape_slug(pointer: str) -> str:
    """The pointer with its $defs/properties keywords left out: /$defs/EngramConfig/properties/use_thp
    reads EngramConfig/use_thp."""
    return "/".join(t for t in pointer.split("/") if t not in ("$defs", "properties", "definitions"))


def is_rule(schema: Any) -> bool:
    """An engram rule: an if/then whose violation is reported with its own id, path and message."""
    return isinstance(schema, dict) and "if" in schema and "x-engram-rule" in schema


class ValidatorCompiler:
    def __init__(self, document: Any, index: SchemaIndex | None = None) -> None:
        self.index = index or SchemaIndex(document)
        self.assert_formats = isinstance(document, dict) and (
            document.get("x-engram-format-assertion") is True or self._format_vocabulary(document)
        )
        self.functions: list[str] = []
        self.constants: dict[str, str] = {}  # Python expression -> name
        self._names: dict[Variant, str] = {}
        # Functions are compiled from a queue, never by recursion, so a $ref chain costs a queue entry per
        # link (bounded by MAX_FUNCTIONS), not a Python stack frame. The in-place calls between them
        # ($ref, allOf, ...: the same value again) are kept as a graph whose cycles are refused.
        self._pending: deque[tuple[Variant, str]] = deque()
        self._current: Variant | None = None
        self._inplace: dict[Variant, set[Variant]] = {}
        self._dynamic = {
            urldefrag(node["$dynamicRef"])[1]
            for node in map(self.index.at, self.index.base)
            if isinstance(node, dict) and isinstance(node.get("$dynamicRef"), str)
        }

    def function(
        self, pointer: str, *, annotate: bool = False, bindings: tuple[tuple[str, str], ...] = (), inplace: bool = False
    ) -> str:
        """The name of the function validating the node at `pointer`; a call from outside the compiler
        also compiles every function it reaches (from the queue) and checks the in-place loops."""
        pointer = self._through_refs(pointer)
        key = Variant(pointer, annotate, self._bind(pointer, bindings))
        if inplace and self._current is not None:
            self._inplace.setdefault(self._current, set()).add(key)
        name = self._names.get(key)
        if name is None:
            if len(self._names) >= MAX_FUNCTIONS:
                raise SchemaError(
                    f"{pointer or '/'}: this schema needs more than {MAX_FUNCTIONS:,} validator functions (a "
                    "$ref chain of that many links, or $dynamicRef binding scopes that each compile their own); "
                    "at most that many: shorten the chain or bind fewer $dynamicAnchors"
                )
            name = self._names[key] = self._unique(function_name(key), key)
            self._pending.append((key, name))
        if self._current is None:
            self._drain()
        return name

    def _drain(self) -> None:
        while self._pending:
            key, name = self._pending.popleft()
            self._current = key
            try:
                self.functions.append(_Node(self, key, name).source())
            finally:
                self._current = None
        self._check_loops()

    def _format_vocabulary(self, document: dict[str, Any]) -> bool:
        """Whether the root's `$schema` is a meta-schema (a local resource) that requires the format-assertion
        vocabulary (`true`): formats are then asserted. Its `false` makes it optional, and formats stay
        annotations, as the test suite reads it."""
        dialect = document.get("$schema")
        meta = self.index.local.get(urldefrag(dialect)[0]) if isinstance(dialect, str) else None
        vocabulary = meta.get("$vocabulary") if isinstance(meta, dict) else None
        return isinstance(vocabulary, dict) and vocabulary.get(FORMAT_ASSERTION) is True

    def constant(self, expression: str) -> str:
        if expression not in self.constants:
            self.constants[expression] = self._unique(f"_c_{digest(expression)}", expression)
        return self.constants[expression]

    def _unique(self, name: str, key: object) -> str:
        """`name`, or a SchemaError where another node or constant already has it (a digest clash)."""
        taken = set(self._names.values()) | set(self.constants.values())
        if name in taken:
            raise SchemaError(f"two schema nodes would share the generated name {name} (a digest clash); report it")
        return name

    def source(self) -> list[str]:
        """Module-level constants, then the functions, each a top-level statement."""
        return [f"{name} = {expr}" for expr, name in self.constants.items()] + self.functions

    def imports(self) -> list[str]:
        """Import lines for the helpers the generated code calls, and only those."""
        text = "\n".join(self.source())
        lines = []
        for module, names in HELPERS.items():
            used = [n for n in names if re.search(rf"\b{n}\b", text)]
            if used:
                lines.append(f"from {module} import {', '.join(used)}")
        return lines

    def _bind(self, pointer: str, bindings: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """Entering a node enters its schema resource: its dynamic anchors bind where still unbound."""
        if not self._dynamic:
            return ()
        bound = dict(bindings)
        for name, target in self.index.dynamic.get(self.index.base_of(pointer), {}).items():
            if name in self._dynamic:
                bound.setdefault(name, target)
        return tuple(sorted(bound.items()))

    def _check_loops(self) -> None:
        """Refuse a cycle of in-place calls, and a chain of them longer than MAX_CHAIN (each is a Python
        frame when a value is validated): an iterative depth-first search, in compile order."""
        depth: dict[Variant, int] = {}  # the longest in-place chain from each finished function

        def children(key: Variant) -> list[Variant]:
            return sorted(self._inplace.get(key, ()), key=self._names.__getitem__)

        for start in self._names:
            if start in depth:
                continue
            path, on_path, stack = [start], {start}, [iter(children(start))]
            while stack:
                nxt = next(stack[-1], None)
                if nxt is None:
                    stack.pop()
                    done = path.pop()
                    on_path.discard(done)
                    depth[done] = 1 + max((depth[c] for c in self._inplace.get(done, ())), default=0)
                    if depth[done] > MAX_CHAIN:
                        raise SchemaError(
                            f"{done.pointer or '/'}: a chain of more than {MAX_CHAIN} in-place references ($ref, "
                            "allOf, ...) applies to one value; at most that many: shorten it (a node that is only "
                            "a $ref costs nothing, it validates as its target)"
                        )
                elif nxt in on_path:
                    raise SchemaError(
                        f"{nxt.pointer or '/'}: the schema applies itself to the same value again through "
                        "in-place keywords ($ref, allOf, anyOf, ...), so validation would never end"
                    )
                elif nxt not in depth:
                    path.append(nxt)
                    on_path.add(nxt)
                    stack.append(iter(children(nxt)))

    def _through_refs(self, pointer: str) -> str:
        """A node that is only a $ref (with annotations) validates as its target: follow such links here, so
        a chain of them is one call when a value is validated. Not with $dynamicRef, whose bindings change
        as resources are entered."""
        seen: set[str] = set()
        while not self._dynamic:
            node = self.index.at(pointer)
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node.keys() <= ALIAS_KEYS):
                break
            if pointer in seen:
                raise SchemaError(
                    f"{pointer or '/'}: the schema applies itself to the same value again through in-place "
                    "keywords ($ref, allOf, anyOf, ...), so validation would never end"
                )
            seen.add(pointer)
            pointer = self.index.resolve(node["$ref"], self.index.base_of(pointer), f"{pointer}/$ref")
        return pointer


class _Node:
    """The source of one node's function."""

    def __init__(self, compiler: ValidatorCompiler, key: Variant, name: str) -> None:
        self.c = compiler
        self.key = key
        self.name = name
        self.ptr = key.pointer
        self.schema = compiler.index.at(key.pointer)
        s = self.schema if isinstance(self.schema, dict) else {}
        self.s = s
        self.own_unevaluated = "unevaluatedProperties" in s or "unevaluatedItems" in s
        self.track = key.annotate or self.own_unevaluated
        self.base = compiler.index.base_of(key.pointer)
        self.rule = None if "if" in s else s.get("x-engram-rule")
        self.message = s.get("x-engram-message") if self.rule else None
        self.lines: list[str] = []
        self.declared = False

    def fresh(self, indent: str) -> str:
        """A new, empty `branch` set (declared once, for the type checker)."""
        first, self.declared = not self.declared, True
        return f"{indent}branch{': set[Any]' if first else ''} = set()"

    def source(self) -> str:
        args = "v: Any, path: str, out: list[Problem] | None" + (", ev: set[Any]" if self.key.annotate else "")
        head = [f"def {self.name}({args}) -> bool:", f"    {'Schema node ' + (self.ptr or '/')!r}"]
        if self.schema is True:
            return "\n".join([*head, "    return True"])
        if self.schema is False:
            problem = self.problem(
                "false", f"no value is allowed here (schema {self.ptr or '/'} is false)", kept="false"
            )
            return "\n".join([*head, *self.fail("    ", problem, stop=True)])
        self.lines.append("    ok = True")
        if self.track:
            self.lines.append(
                "    seen = ev" if self.key.annotate and not self.own_unevaluated else "    seen: set[Any] = set()"
            )
        single = self.types()
        for key in ("const", "enum"):
            if key in self.s:
                self.constant_check(key)
        self.numbers("    " if single in ("integer", "number") else None)
        self.strings("    " if single == "string" else None)
        self.arrays("    " if single == "array" else None)
        self.objects("    " if single == "object" else None)
        self.in_place()
        self.unevaluated()
        if self.key.annotate and self.own_unevaluated:
            self.lines.append("    ev.update(seen)")
        self.lines.append("    return ok")
        return "\n".join(head + self.lines)

    # -- pieces of generated code ----------------------------------------------------------------

    def problem(self, keyword: str, text: str, *, kept: str | None = None, at: str = "path", value: str = "v") -> str:
        """A Problem expression. `kept` is the rule id of a keyword the engram schema uses, whose wording
        stays as users know it; any other keyword's message names the keyword and its schema pointer."""
        rule = self.rule or kept or keyword
        if self.message:
            message = message_expr(self.message, value)
        elif kept:
            message = f"{text!r} + _got({value})"
        else:
            message = f"{text + f' ({keyword} at {self.ptr}/{keyword})'!r} + _got({value})"
        return f"Problem({at}, {rule!r}, {message})"

    @staticmethod
    def fail(indent: str, problem: str, *, stop: bool = False) -> list[str]:
        return [
            f"{indent}if out is None:",
            f"{indent}    return False",
            f"{indent}out.append({problem})",
            f"{indent}{'return False' if stop else 'ok = False'}",
        ]

    def when(self, indent: str, test: str, problem: str) -> list[str]:
        """`if <test>:` reporting `problem`."""
        return [f"{indent}if {test}:", *self.fail(indent + "    ", problem)]

    @staticmethod
    def call(indent: str, call: str) -> list[str]:
        return [
            f"{indent}if not {call}:",
            f"{indent}    if out is None:",
            f"{indent}        return False",
            f"{indent}    ok = False",
        ]

    def child(self, keyword_pointer: str, *, inplace: bool) -> str:
        """The function of a subschema: in place ones share this node's annotations and dynamic scope."""
        return self.c.function(
            keyword_pointer, annotate=self.track and inplace, bindings=self.key.bindings, inplace=inplace
        )

    def apply(self, indent: str, sub: Any, pointer: str, value: str, at: str, mark: str) -> list[str]:
        """Lines applying the subschema at `pointer` to one child value, marking it evaluated when
        annotations are tracked; `true` needs no call."""
        calls = [] if sub is True else self.call(indent, f"{self.child(pointer, inplace=False)}({value}, {at}, out)")
        return calls + ([f"{indent}seen.add({mark})"] if self.track else [])

    def at(self, *tokens: str | int) -> str:
        return self.ptr + "".join(f"/{escape(str(t))}" for t in tokens)

    def guard(self, indent: str | None, test: str) -> tuple[str, list[str]]:
        """Checks for one instance type run under `if <test>:` unless `type` already guarantees it."""
        return (indent, []) if indent else ("        ", [f"    if {test}:"])

    def emit(self, head: list[str], body: list[str]) -> None:
        if body:
            self.lines += head + body

    # -- keywords, by the instance type they constrain ------------------------------------------

    def types(self) -> str | None:
        kinds = self.s.get("type")
        if kinds is None:
            return None
        kinds = [kinds] if isinstance(kinds, str) else kinds
        test = " or ".join(TYPE_TESTS[k] for k in kinds)
        expected = "expected " + " or ".join(TYPE_NAMES[k] for k in kinds)
        self.lines += [
            f"    if not ({test}):",
            *self.fail("        ", self.problem("type", expected, kept="type"), stop=True),
        ]
        return kinds[0] if len(kinds) == 1 else None

    def constant_check(self, key: str) -> None:
        """const and enum, in JSON equality (true is not 1, 1 is 1.0); a long enum is one set lookup of
        the values' JSON-equality keys, so its cost does not grow with its length."""
        values = [self.s[key]] if key == "const" else self.s[key]
        if len(values) > LOOKUP_FROM:
            keys = self.c.constant(f"frozenset(_key(c) for c in {values!r})")
            test = f"_key(v) in {keys}"
        else:
            test = " or ".join(equals("v", c) for c in values) or "False"
        shown = ", ".join(_json_text(c) for c in values[:LOOKUP_FROM])
        more = f" and {len(values) - LOOKUP_FROM:,} more" if len(values) > LOOKUP_FROM else ""
        expected = _json_text(values[0]) if key == "const" else f"one of {shown}{more}"
        self.lines += self.when("    ", f"not ({test})", self.problem(key, f"expected {expected}", kept=key))

    def numbers(self, indent: str | None) -> None:
        i, head = self.guard(indent, "_is_number(v)")
        body: list[str] = []
        for key, test, word, kept in (
            ("minimum", "v < {}", ">=", "minimum"),
            ("maximum", "v > {}", "<=", "maximum"),
            ("exclusiveMinimum", "v <= {}", ">", None),
            ("exclusiveMaximum", "v >= {}", "<", None),
        ):
            if key in self.s:
                bound = self.s[key]
                body += self.when(
                    i, test.format(repr(bound)), self.problem(key, f"expected {word} {bound!r}", kept=kept)
                )
        if "multipleOf" in self.s:
            m = self.s["multipleOf"]
            body += self.when(
                i, f"not _multiple_of(v, {m!r})", self.problem("multipleOf", f"expected a multiple of {m!r}")
            )
        self.emit(head, body)

    def strings(self, indent: str | None) -> None:
        i, head = self.guard(indent, "isinstance(v, str)")
        body: list[str] = []
        for key, op, word in (("minLength", "<", "at least"), ("maxLength", ">", "at most")):
            if key in self.s:
                n = self.s[key]
                body += self.when(i, f"len(v) {op} {n!r}", self.problem(key, f"expected {word} {n} character(s)"))
        if "pattern" in self.s:
            pattern = self.c.constant(f"compile_pattern({self.s['pattern']!r})")
            expected = f"expected a match for the pattern {self.s['pattern']!r}"
            body += self.when(i, f"not pattern_search({pattern}, v)", self.problem("pattern", expected))
        name = self.s.get("format")
        if self.c.assert_formats and isinstance(name, str):
            if name not in FORMAT_CHECKS:
                raise SchemaError(
                    f"{self.at('format')}: format {name!r} cannot be asserted; known: {', '.join(sorted(FORMAT_CHECKS))}"
                )
            check = self.c.constant(f"format_check({name!r})")
            body += self.when(i, f"not {check}(v)", self.problem("format", f"expected a valid {name}"))
        self.emit(head, body)

    def arrays(self, indent: str | None) -> None:
        i, head = self.guard(indent, "isinstance(v, list)")
        body: list[str] = []
        s = self.s
        for key, op, word, kept in (
            ("minItems", "<", "at least", "min-items"),
            ("maxItems", ">", "at most", "max-items"),
        ):
            if key in s:
                problem = self.problem(key, f"expected {word} {s[key]} item(s)", kept=kept)
                body += self.when(i, f"len(v) {op} {s[key]!r}", problem)
        if s.get("uniqueItems") is True:
            body += self.when(
                i, "not _unique(v)", self.problem("uniqueItems", "expected distinct items", kept="unique-items")
            )
        prefix = s.get("prefixItems", [])
        for n, _ in enumerate(prefix):
            if prefix[n] is not True:
                fn = self.child(self.at("prefixItems", n), inplace=False)
                body += [f"{i}if len(v) > {n}:", *self.call(i + "    ", f"{fn}(v[{n}], path + {f'/{n}'!r}, out)")]
        if prefix and self.track:
            body.append(f"{i}seen.update(range(min(len(v), {len(prefix)})))")
        if "items" in s:
            body += self.items(i, len(prefix))
        if "contains" in s:
            body += self.contains(i)
        self.emit(head, body)

    def items(self, i: str, start: int) -> list[str]:
        body = []
        if self.s["items"] is False:
            problem = self.problem("items", f"expected at most {start} item(s)")
            body += self.when(i, f"len(v) > {start}", problem)
        elif self.s["items"] is not True:
            fn = self.child(self.at("items"), inplace=False)
            body += [
                f"{i}for n in range({start}, len(v)):",
                *self.call(i + "    ", f'{fn}(v[n], f"{{path}}/{{n}}", out)'),
            ]
        if self.track:
            body.append(f"{i}seen.update(range(len(v)))")
        return body

    def contains(self, i: str) -> list[str]:
        fn = self.child(self.at("contains"), inplace=False)
        least, most = self.s.get("minContains", 1), self.s.get("maxContains")
        body = [
            f"{i}matched = 0",
            f"{i}for n, x in enumerate(v):",
            f'{i}    if {fn}(x, f"{{path}}/{{n}}", None):',
            f"{i}        matched += 1",
        ]
        if self.track:
            body.append(f"{i}        seen.add(n)")
        if least > 0:
            keyword = "contains" if "minContains" not in self.s else "minContains"
            problem = self.problem(keyword, f"expected at least {least} item(s) matching contains")
            body += self.when(i, f"matched < {least!r}", problem)
        if most is not None:
            problem = self.problem("maxContains", f"expected at most {most} item(s) matching contains")
            body += self.when(i, f"matched > {most!r}", problem)
        return body

    def objects(self, indent: str | None) -> None:
        i, head = self.guard(indent, "isinstance(v, dict)")
        body: list[str] = []
        s = self.s
        required = s.get("required", [])
        if len(required) > LOOKUP_FROM:  # one loop over a constant tuple, not a test per name
            names = self.c.constant(repr(tuple(required)))
            at = "path + '/' + name.replace('~', '~0').replace('/', '~1')"
            problem = f"Problem({at}, 'required', 'missing required field ' + name)"
            body += [f"{i}for name in {names}:", *self.when(i + "    ", "name not in v", problem)]
        else:
            for key in required:
                at = f"path + {'/' + escape(key)!r}"
                body += self.when(
                    i, f"{key!r} not in v", f"Problem({at}, 'required', {'missing required field ' + key!r})"
                )
        # `dependencies`, the older keyword, is honoured: a list as dependentRequired, a schema as dependentSchemas
        older = s.get("dependencies", {}) if isinstance(s.get("dependencies"), dict) else {}
        for keyword, lists in (("dependentRequired", s.get("dependentRequired", {})), ("dependencies", older)):
            for key, needed in lists.items():
                for other in needed if isinstance(needed, list) else ():
                    at = f"path + {'/' + escape(other)!r}"
                    text = f"missing field {other}, required when {key} is present ({keyword} at {self.at(keyword)})"
                    body += self.when(
                        i, f"{key!r} in v and {other!r} not in v", f"Problem({at}, {keyword!r}, {text!r})"
                    )
        for key, op, word in (("minProperties", "<", "at least"), ("maxProperties", ">", "at most")):
            if key in s:
                body += self.when(i, f"len(v) {op} {s[key]!r}", self.problem(key, f"expected {word} {s[key]} field(s)"))
        patterns = [self.c.constant(f"compile_pattern({p!r})") for p in s.get("patternProperties", {})]
        if "additionalProperties" in s:  # first: unknown fields lead the report, as users know it
            body += self.additional(i, patterns)
        if "propertyNames" in s and s["propertyNames"] is not True:
            fn = self.child(self.at("propertyNames"), inplace=False)
            body += [f"{i}for key in v:", *self.call(i + "    ", f'{fn}(key, path + "/" + _escape(key), out)')]
        for key, sub in s.get("properties", {}).items():
            at = f"path + {'/' + escape(key)!r}"
            lines = self.apply(i + "    ", sub, self.at("properties", key), f"v[{key!r}]", at, repr(key))
            body += [f"{i}if {key!r} in v:", *lines] if lines else []
        for pattern, (source, sub) in zip(patterns, s.get("patternProperties", {}).items(), strict=True):
            at = 'path + "/" + _escape(key)'
            lines = self.apply(i + "        ", sub, self.at("patternProperties", source), "x", at, "key")
            loop = [f"{i}for key, x in v.items():", f"{i}    if pattern_search({pattern}, key):"]
            body += [*loop, *lines] if lines else []
        schemas = [("dependentSchemas", key) for key in s.get("dependentSchemas", {})]
        schemas += [("dependencies", key) for key, sub in older.items() if isinstance(sub, dict | bool)]
        for keyword, key in schemas:
            fn = self.child(self.at(keyword, key), inplace=True)
            body += [
                f"{i}if {key!r} in v:",
                *self.call(i + "    ", f"{fn}(v, path, out{', seen' if self.track else ''})"),
            ]
        self.emit(head, body)

    def additional(self, i: str, patterns: list[str]) -> list[str]:
        sub = self.s["additionalProperties"]
        names = list(self.s.get("properties", {}))
        known = self.c.constant(f"frozenset({tuple(names)!r})")
        test = "".join(f" and not pattern_search({p}, key)" for p in patterns)
        body = [f"{i}for key in sorted(v.keys() - {known}):"]
        inner = i + "        " if test else i + "    "
        if test:
            body.append(f"{i}    if True{test}:")
        if sub is False:
            listed = ", ".join(names)
            at = 'path + "/" + _escape(key)'
            message = f'"unknown field " + repr(_shown(key)) + {"; known fields: " + listed!r}'
            body += self.fail(inner, f"Problem({at}, 'unknown-field', {message})")
        elif sub is not True:
            fn = self.child(self.at("additionalProperties"), inplace=False)
            body += self.call(inner, f'{fn}(v[key], path + "/" + _escape(key), out)')
        if self.track:
            body.append(f"{inner}seen.add(key)")
        return body if len(body) > (2 if test else 1) else []

    # -- keywords that apply subschemas to the same value ----------------------------------------

    def in_place(self) -> None:
        s = self.s
        annotations = ", seen" if self.track else ""
        for keyword in ("$ref", "$dynamicRef"):
            if isinstance(s.get(keyword), str):
                target = self.c.index.resolve(s[keyword], self.base, self.at(keyword))
                if keyword == "$dynamicRef":
                    target = self.dynamic_target(s[keyword], target)
                fn = self.c.function(target, annotate=self.track, bindings=self.key.bindings, inplace=True)
                self.lines += self.call("    ", f"{fn}(v, path, out{annotations})")
        for n, sub in enumerate(s.get("allOf", [])):
            if is_rule(sub):
                self.rule_check(self.at("allOf", n), sub)
            elif sub is not True or self.track:
                self.lines += self.call(
                    "    ", f"{self.child(self.at('allOf', n), inplace=True)}(v, path, out{annotations})"
                )
        if "anyOf" in s:
            self.any_of()
        if "oneOf" in s:
            self.one_of()
        if "not" in s:
            fn = self.c.function(self.at("not"), bindings=self.key.bindings, inplace=True)
            self.lines += self.when(
                "    ", f"{fn}(v, path, None)", self.problem("not", "expected not this form", kept="not")
            )
        if is_rule(s):
            self.rule_check(self.ptr, s)
        elif "if" in s and ("then" in s or "else" in s or self.track):  # a lone `if` only annotates
            self.if_then_else()

    def dynamic_target(self, ref: str, target: str) -> str:
        """$dynamicRef: where the initial target is a $dynamicAnchor of that name, the outermost
        resource in the dynamic scope that declares the name wins."""
        name = urldefrag(ref)[1]
        node = self.c.index.at(target)
        if isinstance(node, dict) and node.get("$dynamicAnchor") == name:
            return dict(self.key.bindings).get(name, target)
        return target

    def branch(self, pointer: str) -> str:
        return self.c.function(pointer, annotate=self.track, bindings=self.key.bindings, inplace=True)

    def any_of(self) -> None:
        branches = [self.branch(self.at("anyOf", n)) for n in range(len(self.s["anyOf"]))]
        problem = self.problem("anyOf", "expected one of the allowed forms", kept="any-of")
        if not self.track:
            tests = " or ".join(f"{fn}(v, path, None)" for fn in branches)
            self.lines += self.when("    ", f"not ({tests})", problem)
            return
        self.lines.append("    matched = 0")
        for fn in branches:  # every branch runs: each that passes contributes its annotations
            self.lines += [
                self.fresh("    "),
                f"    if {fn}(v, path, None, branch):",
                "        matched += 1",
                "        seen |= branch",
            ]
        self.lines += self.when("    ", "not matched", problem)

    def one_of(self) -> None:
        self.lines.append("    matched = 0")
        for n in range(len(self.s["oneOf"])):
            fn = self.branch(self.at("oneOf", n))
            if self.track:
                self.lines += [
                    self.fresh("    "),
                    f"    if {fn}(v, path, None, branch):",
                    "        matched += 1",
                    "        chosen = branch",
                ]
            else:
                self.lines += [f"    if {fn}(v, path, None):", "        matched += 1"]
        problem = self.problem("oneOf", "expected exactly one of the forms to match")
        self.lines += self.when("    ", "matched != 1", problem)
        if self.track:
            self.lines += ["    else:", "        seen |= chosen"]

    def if_then_else(self) -> None:
        test = self.branch(self.at("if"))
        then = self.branch(self.at("then")) if "then" in self.s else None
        other = self.branch(self.at("else")) if "else" in self.s else None
        annotations = ", seen" if self.track else ""
        if self.track:
            self.lines += [self.fresh("    "), f"    if {test}(v, path, None, branch):", "        seen |= branch"]
        else:
            self.lines.append(f"    if {test}(v, path, None):")
        self.lines += self.call("        ", f"{then}(v, path, out{annotations})") if then else ["        pass"]
        if other:
            self.lines += ["    else:", *self.call("        ", f"{other}(v, path, out{annotations})")]

    def rule_check(self, pointer: str, rule: dict[str, Any]) -> None:
        """An engram rule: when `if` holds and `then` does not, one Problem at x-engram-path with the
        rule's id and message (`{value!r}` is the value there, `{problems}` what its definition finds)."""
        rel = rule["x-engram-path"]
        parts = tuple(unescape(p) for p in rel.split("/")[1:])
        problems = None
        if "{problems}" in rule["x-engram-message"]:
            holder = pointer + "/then" + "".join(f"/properties/{escape(p)}" for p in parts)
            node = self.c.index.at(holder) if _exists(self.c.index, holder) else {}
            if not isinstance(node, dict) or not isinstance(node.get("$ref"), str):
                raise SchemaError(
                    f"{pointer}: {{problems}} needs the rule's `then` to hold a $ref at its x-engram-path"
                )
            target = self.c.index.resolve(node["$ref"], self.c.index.base_of(holder), holder + "/$ref")
            problems = f"_details({self.c.function(target, bindings=self.key.bindings)}, _at(v, {parts!r}))"
        message = message_expr(rule["x-engram-message"], f"_at(v, {parts!r})", problems)
        problem = f"Problem(path + {rel!r}, {rule['x-engram-rule']!r}, {message})"
        test = self.branch(pointer + "/if")
        then = self.branch(pointer + "/then")
        self.lines.append(f"    # rule {rule['x-engram-rule']!r}")
        if not self.track:
            self.lines += self.when("    ", f"{test}(v, path, None) and not {then}(v, path, None)", problem)
            return
        self.lines += [
            self.fresh("    "),
            f"    if {test}(v, path, None, branch):",
            "        seen |= branch",
            self.fresh("        "),
            f"        if {then}(v, path, None, branch):",
            "            seen |= branch",
            "        else:",
            *self.fail("            ", problem),
        ]

    def unevaluated(self) -> None:
        s = self.s
        if "unevaluatedItems" in s:
            sub = s["unevaluatedItems"]
            body = ["    if isinstance(v, list):"]
            if sub is not True:
                body += ["        for n in range(len(v)):", "            if n not in seen:"]
                if sub is False:
                    problem = self.problem(
                        "unevaluatedItems", "expected no item here", at='f"{path}/{n}"', value="v[n]"
                    )
                    body += self.fail("                ", problem)
                else:
                    fn = self.child(self.at("unevaluatedItems"), inplace=False)
                    body += self.call("                ", f'{fn}(v[n], f"{{path}}/{{n}}", out)')
            self.lines += [*body, "        seen.update(range(len(v)))"]
        if "unevaluatedProperties" in s:
            sub = s["unevaluatedProperties"]
            body = ["    if isinstance(v, dict):"]
            if sub is not True:
                body += ["        for key in sorted(v.keys() - seen):"]
                at = 'path + "/" + _escape(key)'
                if sub is False:
                    text = f" (unevaluatedProperties at {self.at('unevaluatedProperties')})"
                    message = f'"unknown field " + repr(_shown(key)) + {text!r}'
                    body += self.fail(
                        "            ", f"Problem({at}, {self.rule or 'unevaluatedProperties'!r}, {message})"
                    )
                else:
                    fn = self.child(self.at("unevaluatedProperties"), inplace=False)
                    body += self.call("            ", f"{fn}(v[key], {at}, out)")
            self.lines += [*body, "        seen.update(v)"]


def _exists(index: SchemaIndex, pointer: str) -> bool:
    try:
        index.at(pointer)
    except (KeyError, IndexError, ValueError, TypeError):
        return False
    return True


def equals(v: str, const: Any) -> str:
    """JSON equality: true/false are not 1/0, and 1 equals 1.0."""
    if isinstance(const, bool):
        return f"{v} is {const}"
    if const is None:
        return f"{v} is None"
    if isinstance(const, str):
        return f"{v} == {const!r}"
    return f"_json_equal({v}, {const!r})"


def _json_text(value: Any) -> str:
    return repr(value) if not isinstance(value, bool) else str(value).lower()


def message_expr(message: str, value: str, problems: str | None = None) -> str:
    """The message with its placeholders filled: {value!r} (the offending value) and {problems}."""
    arguments = []
    if "{value" in message:
        arguments.append(f"value=_shown({value})")
    if "{problems}" in message:
        arguments.append(f"problems={problems}")
    return f"{message!r}.format({', '.join(arguments)})" if arguments else repr(message)


def struct_rules(struct: str, schema: dict[str, Any]) -> str:
    """The if/then rules of one struct compiled for its resolved instance, `check_<struct>_rules(c, path,
    out)`: every field is present and typed, so the JSON presence and type tests fall away and each rule
    is a few attribute reads. The same rules compile to node functions for JSON values above; this
    second target exists for speed (run on every construction, a rule costs 0.015 us here against
    0.14 us through the JSON form on a dict of the struct, which would make load_config 2.5x slower)."""
    lines = [
        f"def check_{struct}_rules(c: Any, path: str, out: list[Problem]) -> None:",
        f'    """The if/then rules of {struct}, on a resolved instance."""',
    ]
    for sub in schema["allOf"]:
        if not is_rule(sub):
            raise SchemaError(f"/$defs/{struct}/allOf: only if/then rules may sit beside a struct's fields")
        rel = sub["x-engram-path"]
        field_name = rel.removeprefix("/")
        _known_field(field_name, schema, struct)
        message = message_expr(sub["x-engram-message"], f"c.{field_name}")
        lines += [
            f"    if ({_attr_expr(sub['if'], schema, struct)}) and not ({_attr_expr(sub['then'], schema, struct)}):",
            f"        out.append(Problem(path + {rel!r}, {sub['x-engram-rule']!r}, {message}))",
        ]
    return "\n".join(lines)


def _known_field(name: str, struct_schema: dict[str, Any], struct: str) -> None:
    if name not in struct_schema.get("properties", {}):
        raise SchemaError(f"/$defs/{struct}/allOf: a struct rule may name only the struct's own fields, not {name!r}")


def _attr_expr(schema: dict[str, Any], struct_schema: dict[str, Any], struct: str) -> str:
    allowed = {"properties", "required"}
    if set(schema) - allowed:
        raise SchemaError(f"/$defs/{struct}: struct rules may use only properties and required, got {sorted(schema)}")
    terms = []
    for key, sub in schema.get("properties", {}).items():
        _known_field(key, struct_schema, struct)
        if not isinstance(sub, dict) or set(sub) - {"const", "enum", "minimum", "maximum"}:
            raise SchemaError(
                f"/$defs/{struct}: struct rules compare fields with const, enum, minimum or maximum only, got {sorted(sub)}"
            )
        # The instance is resolved (typed), so a bound compares the field directly.
        if "minimum" in sub:
            terms.append(f"c.{key} >= {sub['minimum']!r}")
        if "maximum" in sub:
            terms.append(f"c.{key} <= {sub['maximum']!r}")
        if "const" in sub:
            terms.append(equals(f"c.{key}", sub["const"]))
        if "enum" in sub:
            terms.append("(" + " or ".join(equals(f"c.{key}", e) for e in sub["enum"]) + ")")
    return " and ".join(terms) or "True"
