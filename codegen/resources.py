"""Local resources: the other documents of a schema set, by URI, so a `$ref` to another document by its
`$id` (or by the URI it is served under) compiles. Given as a mapping of URIs to documents, or as a
directory of *.json files. Nothing is ever fetched: a reference to a URI that is not registered is still
refused (codegen.index).

A directory is listed without following a symlink (nothing outside it is read, whatever a link inside
points at), at most MAX_DEPTH levels deep, and its documents are read only when a reference asks for
them: by path first, and only for a URI no path names are the others read for their `$id`. Bounded: at
most MAX_DOCUMENTS documents of at most MAX_FILE_BYTES each, MAX_TOTAL_BYTES in all."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlsplit

from codegen.load import SchemaError, check_json_value

MAX_DOCUMENTS = 10_000
MAX_FILE_BYTES = 16 << 20
MAX_TOTAL_BYTES = 64 << 20
MAX_DEPTH = 32

Resources = Mapping[str, Any] | str | os.PathLike[str]


def local_resources(source: Resources, base_uri: str | None = None) -> Mapping[str, Any]:
    """URI (no fragment) -> document: each document of a mapping under its key, and each *.json below a
    directory under `base_uri` + its relative path (`file://` + its absolute path without one); a document
    whose root declares an absolute `$id` under that too (the spec's name for it)."""
    if not isinstance(source, Mapping | str | os.PathLike):
        raise SchemaError(
            f"local resources are a mapping of URIs to documents or a directory, not {type(source).__name__}"
        )
    if isinstance(source, Mapping):
        if base_uri is not None:
            raise SchemaError("base_uri is for a directory of documents; a mapping names each document's URI itself")
        found: dict[str, Any] = {}
        for uri, document in source.items():
            _register(found, _uri(uri, "a local resource's key"), document, f"the local resource {uri!r}")
        return found
    try:
        root = Path(source)
    except TypeError:
        raise SchemaError(f"local resources: {source!r:.200} is not a directory path") from None
    return DirectoryResources(root, base_uri)


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
    try:
        check_json_value(document)
    except SchemaError as exc:
        raise SchemaError(f"{what}: {exc}") from None
    if uri in found and found[uri] != document:
        raise SchemaError(f"{what}: two different documents are registered under {uri!r}")
    if len(found) >= MAX_DOCUMENTS and uri not in found:
        raise SchemaError(f"{what}: more than {MAX_DOCUMENTS:,} local resources; register only the schema set's")
    found[uri] = document


def _json_files(root: Path) -> list[Path]:
    """*.json regular files below `root`, in sorted order, no symlink followed, at most MAX_DEPTH deep."""
    found: list[Path] = []
    stack = [(root, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            raise SchemaError(f"local resources: cannot list {directory}: {exc.strerror}") from None
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if depth + 1 >= MAX_DEPTH:
                    raise SchemaError(f"local resources: {entry.path} is more than {MAX_DEPTH} directories deep")
                stack.append((Path(entry.path), depth + 1))
            elif entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
                if len(found) > MAX_DOCUMENTS:
                    raise SchemaError(f"local resources: more than {MAX_DOCUMENTS:,} documents in {root}")
    return sorted(found)


class DirectoryResources(Mapping[str, Any]):
    """The documents of a directory by URI, each read when first asked for (see the module's docstring)."""

    def __init__(self, root: Path, base_uri: str | None) -> None:
        if not root.is_dir():
            raise SchemaError(f"local resources: {root} is not a directory of *.json schema documents")
        base = None if base_uri is None else _uri(base_uri, "base_uri")
        if base is not None and not base.endswith("/"):
            raise SchemaError(f"base_uri {base_uri!r} must end with '/': files are named relative to it")
        self.root = root
        self.unread = {
            (base + path.relative_to(root).as_posix() if base else path.absolute().as_uri()): path
            for path in _json_files(root)
        }
        self.found: dict[str, Any] = {}
        self.read_bytes = 0

    def _read(self, uri: str) -> None:
        path = self.unread.pop(uri)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise SchemaError(f"{path}: not a readable JSON document ({exc.strerror})") from None
        if len(data) > MAX_FILE_BYTES:
            raise SchemaError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB; a schema document is not that big")
        self.read_bytes += len(data)
        if self.read_bytes > MAX_TOTAL_BYTES:
            raise SchemaError(f"{path}: the documents read from {self.root} pass {MAX_TOTAL_BYTES >> 20} MiB in all")
        try:
            document = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise SchemaError(f"{path}: not a readable JSON document ({str(exc)[:200]})") from None
        _register(self.found, uri, document, str(path))

    def __contains__(self, uri: object) -> bool:
        if not isinstance(uri, str):
            return False
        if uri in self.unread:
            self._read(uri)
        while uri not in self.found and self.unread:  # only an $id can name it: read the rest for theirs
            self._read(next(iter(self.unread)))
        return uri in self.found

    def __getitem__(self, uri: str) -> Any:
        if uri not in self:
            raise KeyError(uri)
        return self.found[uri]

    def __iter__(self) -> Iterator[str]:
        while self.unread:
            self._read(next(iter(self.unread)))
        return iter(dict(self.found))

    def __len__(self) -> int:
        return len(list(iter(self)))


def _register(found: dict[str, Any], uri: str, document: Any, what: str) -> None:
    """`document` under `uri`, and under its root's absolute `$id` where it declares one."""
    _add(found, uri, document, what)
    declared = document.get("$id") if isinstance(document, dict) else None
    if isinstance(declared, str) and _absolute(declared):
        _add(found, _uri(declared, f"{what}: its $id"), document, what)
