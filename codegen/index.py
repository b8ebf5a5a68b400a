"""Where every schema node of a document lives: its JSON pointer, base URI and schema resource, so that
`$ref`, `$dynamicRef`, `$anchor` and `$id` resolve as JSON Schema 2020-12 says, without fetching
anything. A reference may leave the document for a local resource (a document the caller registered
under its URI, codegen.resources) or a bundled 2020-12 meta-schema; any other is refused here, naming
the keyword and pointer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin, urlsplit

import jsonschema_specifications

from codegen.load import SchemaError

# The 2020-12 meta-schemas ship with jsonschema: references to them resolve to these copies (they are
# part of the standard, not remote documents), and the generator still never fetches anything.
BUNDLED = "https://json-schema.org/draft/2020-12/"

# The keywords whose values are subschemas, by shape. Only these locate nodes: an `$id` inside an
# unknown keyword is not an identifier (the spec), so the walk never looks there.
SINGLE = (
    "additionalProperties",
    "propertyNames",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
MAPS = ("$defs", "properties", "patternProperties", "dependentSchemas")
# Keywords whose values are instance data, never schemas: a $ref into them is refused.
DATA = frozenset({"default", "examples", "const", "enum"})
LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")


def escape(token: str) -> str:
    """One JSON pointer reference token (RFC 6901)."""
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def join(base: str, ref: str, where: str = "") -> str:
    """`ref` resolved against `base` (RFC 3986), also for bases urljoin does not know (urn:, tag:). A
    reference Python cannot parse (`http://[::1`) is a SchemaError at `where`."""
    try:
        if urlsplit(ref).scheme:
            joined = ref
        elif ref.startswith("#") or not ref:
            joined = urldefrag(base)[0] + ref
        else:
            joined = urljoin(base, ref)
        urldefrag(joined)  # parseable, so every later split of it is too
        return joined
    except ValueError as exc:
        raise SchemaError(f"{where or '/'}: {ref[:200]!r} is not a URI reference ({exc})") from None


def children(schema: Any, pointer: str) -> list[tuple[str, Any]]:
    """(pointer, subschema) of every subschema directly inside `schema`, in document order."""
    if not isinstance(schema, dict):
        return []
    found = []
    for key, value in schema.items():
        if key in SINGLE:
            found.append((f"{pointer}/{escape(key)}", value))
        elif key in MAPS and isinstance(value, dict):
            found += [(f"{pointer}/{escape(key)}/{escape(name)}", sub) for name, sub in value.items()]
        elif key in LISTS and isinstance(value, list):
            found += [(f"{pointer}/{key}/{i}", sub) for i, sub in enumerate(value)]
        elif key == "dependencies" and isinstance(value, dict):  # schemas beside name lists
            found += [
                (f"{pointer}/dependencies/{escape(n)}", sub) for n, sub in value.items() if isinstance(sub, dict | bool)
            ]
    return found


class SchemaIndex:
    """Pointers are JSON pointers into the document; the nodes of a local resource or a bundled
    meta-schema have pointers that start with its name, `~doc<n>` or `~meta<n>`, which no pointer into the
    document can (those start with `/`). `resources`: URI (no fragment) -> document, loaded only when a
    reference reaches it."""

    def __init__(self, document: Any, resources: Mapping[str, Any] | None = None) -> None:
        self.document = document
        self.local = {} if resources is None else resources  # a directory's documents are read as references reach them
        self.bundled: dict[str, Any] = {}  # "~doc<n>" -> local resource, "~meta<n>" -> bundled meta-schema
        self.origin: dict[str, str] = {}  # "~doc<n>" -> the URI it was registered under
        self.base: dict[str, str] = {}  # pointer -> base URI of the node (no fragment)
        self.resources: dict[str, str] = {}  # resource URI -> pointer of its root
        self.anchors: dict[str, str] = {}  # "uri#name" -> pointer ($anchor and $dynamicAnchor)
        self.dynamic: dict[str, dict[str, str]] = {}  # resource URI -> {$dynamicAnchor name: pointer}
        self.resources[""] = ""
        self._walk("", document, "")
        self._bundle()

    def _bundle(self) -> None:
        """Load the local resources and meta-schemas the document refers to, and those they refer to,
        before any compiling."""
        done = 0
        pointers = list(self.base)
        while done < len(pointers):
            pointer = pointers[done]
            done += 1
            node = self.at(pointer)
            for key in ("$ref", "$dynamicRef"):
                ref = node.get(key) if isinstance(node, dict) else None
                uri = urldefrag(join(self.base[pointer], ref, f"{pointer}/{key}"))[0] if isinstance(ref, str) else ""
                if uri in self.resources:
                    continue
                if uri in self.local:
                    contents = self.local[uri]
                    loaded = next((n for n, doc in self.bundled.items() if doc is contents), None)
                    if loaded is not None:  # registered under its $id too, and loaded by that name already
                        self.resources[uri] = loaded
                        continue
                    name = f"~doc{len(self.bundled)}"
                    self.origin[name] = uri
                    self.resources[uri] = name  # its own $id, when another, names it too
                elif uri.startswith(BUNDLED):
                    try:
                        contents = jsonschema_specifications.REGISTRY.contents(uri)
                    except LookupError:
                        continue  # resolve() names it as a remote reference
                    name = f"~meta{len(self.bundled)}"
                else:
                    continue  # resolve() names it as a remote reference
                self.bundled[name] = contents
                before = len(self.base)
                self._walk(name, contents, uri)
                pointers += list(self.base)[before:]

    def _walk(self, root: str, document: Any, base: str) -> None:
        stack: list[tuple[str, Any, str]] = [(root, document, base)]
        while stack:
            pointer, node, base = stack.pop()
            if isinstance(node, dict):
                base = self._enter(pointer, node, base)
            self.base[pointer] = base
            stack.extend((p, sub, base) for p, sub in reversed(children(node, pointer)))

    def _enter(self, pointer: str, node: dict[str, Any], base: str) -> str:
        if isinstance(node.get("$id"), str):
            base = urldefrag(join(base, node["$id"], f"{pointer}/$id"))[0]
            if self.resources.get(base, pointer) != pointer:
                raise SchemaError(f"{pointer}/$id: {base!r} already identifies {self.resources[base] or '/'}")
            self.resources[base] = pointer
        for key in ("$anchor", "$dynamicAnchor"):
            name = node.get(key)
            if isinstance(name, str):
                if self.anchors.get(f"{base}#{name}", pointer) != pointer:
                    raise SchemaError(f"{pointer}/{key}: anchor {name!r} is defined twice in resource {base!r}")
                self.anchors[f"{base}#{name}"] = pointer
        if isinstance(node.get("$dynamicAnchor"), str):
            self.dynamic.setdefault(base, {})[node["$dynamicAnchor"]] = pointer
        return base

    def readable(self, message: str) -> str:
        """`message` with each local resource's pointer prefix (`~doc<n>`) written as its URI and `#`."""
        for name, uri in self.origin.items():
            message = re.sub(rf"{re.escape(name)}(?!\d)", (f"{uri}#").replace("\\", "\\\\"), message)
        return message

    def at(self, pointer: str) -> Any:
        head, _, _ = pointer.partition("/")
        node = self.bundled[head] if head else self.document
        for token in pointer.split("/")[1:]:
            node = node[int(token)] if isinstance(node, list) else node[unescape(token)]
        return node

    def base_of(self, pointer: str) -> str:
        """The base URI of a node; a node reached only by a pointer takes that of its nearest indexed
        ancestor (an `$id` inside an unknown keyword identifies nothing)."""
        while pointer not in self.base:
            pointer = pointer.rsplit("/", 1)[0]
        return self.base[pointer]

    def resolve(self, ref: str, base: str, where: str) -> str:
        """The pointer of the node `ref` names, read against `base`; `where` is the referring keyword."""
        uri, fragment = urldefrag(join(base, ref, where))
        if uri not in self.resources:
            raise SchemaError(
                f"{where}: remote reference {ref!r} (resolves to {uri!r}) is not supported: the generator never "
                "fetches; embed the referenced schema under $defs with its $id, or register the document as a local "
                "resource under that URI"
            )
        root = self.resources[uri]
        fragment = unquote(fragment)
        if fragment and not fragment.startswith("/"):
            target = self.anchors.get(f"{uri}#{fragment}")
            if target is None:
                raise SchemaError(
                    f"{where}: {ref!r} names no $anchor or $dynamicAnchor {fragment!r} in {uri or 'the document'}"
                )
            return target
        pointer = root + fragment
        node: Any = self.at(root)
        at = root
        for token in fragment.split("/")[1:]:
            if at in self.base and unescape(token) in DATA:
                raise SchemaError(
                    f"{where}: {ref!r} points into {unescape(token)!r} at {at or '/'}, which holds data, not schemas"
                )
            at = f"{at}/{token}"
            if isinstance(node, dict) and unescape(token) in node:
                node = node[unescape(token)]
            elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
                node = node[int(token)]
            else:
                raise SchemaError(f"{where}: {ref!r} points at nothing (no {token!r} at {pointer})")
        if not isinstance(node, (dict, bool)):
            raise SchemaError(f"{where}: {ref!r} points at {pointer}, which is not a schema")
        return pointer
