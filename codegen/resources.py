"""Local resources: the other documents of a schema set, by URI, so a `$ref` to another document by its
`$id` (or by the URI it is served under) compiles. Given as a mapping of URIs to documents, or as a
directory of *.json files. Nothing is ever fetched: a reference to a URI that is not registered is still
refused (codegen.index). Bounded: at most MAX_DOCUMENTS documents of at most MAX_FILE_BYTES each."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlsplit

from codegen.load import SchemaError

MAX_DOCUMENTS = 10_000
MAX_FILE_BYTES = 16 << 20

Resources = Mapping[str, Any] | str | os.PathLike[str]


def local_resources(source: Resources, base_uri: str | None = None) -> dict[str, Any]:
    """URI (no fragment) -> document: each document of a mapping under its key, and each *.json below a
    directory under `base_uri` + its relative path (`file://` + its absolute path without one); a document
    whose root declares an absolute `$id` under that too (the spec's name for it)."""
    if isinstance(source, Mapping):
        if base_uri is not None:
            raise SchemaError("base_uri is for a directory of documents; a mapping names each document's URI itself")
        found: dict[str, Any] = {}
        for uri, document in source.items():
            _register(found, _uri(uri, "a local resource's key"), document, f"the local resource {uri!r}")
        return found
    return _directory(Path(source), base_uri)


def _uri(text: Any, what: str) -> str:
    if not isinstance(text, str):
        raise SchemaError(f"{what} must be a URI string, not {type(text).__name__}")
    try:
        uri, fragment = urldefrag(text)
        absolute = bool(urlsplit(uri).scheme)
    except ValueError as exc:
        raise SchemaError(f"{what} {text[:200]!r} is not a URI ({exc})") from None
    if fragment or not absolute:
        raise SchemaError(f"{what} {text[:200]!r} must be an absolute URI without a fragment")
    return uri


def _absolute(text: str) -> bool:
    try:
        return bool(urlsplit(text).scheme)
    except ValueError:
        return True  # not parseable: _uri names it


def _add(found: dict[str, Any], uri: str, document: Any, what: str) -> None:
    if not isinstance(document, dict | bool):
        raise SchemaError(f"{what} is not a schema (an object or a boolean), it is {type(document).__name__}")
    if uri in found and found[uri] != document:
        raise SchemaError(f"{what}: two different documents are registered under {uri!r}")
    if len(found) >= MAX_DOCUMENTS and uri not in found:
        raise SchemaError(f"{what}: more than {MAX_DOCUMENTS:,} local resources; register only the schema set's")
    found[uri] = document


def _directory(root: Path, base_uri: str | None) -> dict[str, Any]:
    if not root.is_dir():
        raise SchemaError(f"local resources: {root} is not a directory of *.json schema documents")
    base = None if base_uri is None else _uri(base_uri, "base_uri")
    if base is not None and not base.endswith("/"):
        raise SchemaError(f"base_uri {base_uri!r} must end with '/': files are named relative to it")
    found: dict[str, Any] = {}
    for path in sorted(root.rglob("*.json")):
        if not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            raise SchemaError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; a schema document is not that big")
        try:
            document = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError) as exc:
            raise SchemaError(f"{path}: not a readable JSON document ({str(exc)[:200]})") from None
        relative = path.relative_to(root).as_posix()
        _register(found, base + relative if base else path.resolve().as_uri(), document, str(path))
    return found


def _register(found: dict[str, Any], uri: str, document: Any, what: str) -> None:
    """`document` under `uri`, and under its root's absolute `$id` where it declares one."""
    _add(found, uri, document, what)
    declared = document.get("$id") if isinstance(document, dict) else None
    if isinstance(declared, str) and _absolute(declared):
        _add(found, _uri(declared, f"{what}: its $id"), document, what)
