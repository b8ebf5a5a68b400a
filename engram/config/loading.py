"""Build validated Engram configs from files, JSON, dicts, the environment and command-line flags.

The structs, validators and flags are generated from schema/engram.schema.json (engram._generated);
this module only gathers the inputs, applies precedence, and raises one ConfigError listing every
problem. Precedence, lowest first: schema default, environment, the document, --engram-config JSON,
--engram-config.<field> (and FIELD=VALUE overrides); later flags beat earlier ones.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from engram._generated.cli import DEPLOYMENT_FLAGS, ENGRAM_FIELDS, ENGRAM_NULLABLE, add_deployment_args, add_engram_args
from engram._generated.structs import (
    ENV_DEFAULTS,
    INTEGER_FIELDS,
    OLDER_NAMES,
    SECTIONS,
    VLLM_FIELDS,
    EngramConfig,
    EngramConfigInput,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    resolve_engram_config,
)
from engram._generated.validators import FIELD_CHECKS, check_document
from engram.errors import ConfigError, Problem
from engram.memory.host import HostLimits, verify_host_memory
from engram.validation.behaviour import NULL_RESOLUTION
from engram.validation.env import env_bool, env_text, parse_bool
from engram.validation.json_values import _describe, _shown
from engram.validation.patterns import PatternTimeout, pattern_budget

__all__ = [
    "PARTS",
    "VLLM_FIELDS",
    "ConfigError",
    "Deployment",
    "EngramConfig",
    "HostLimits",
    "LoadConfig",
    "ModelConfig",
    "ParallelConfig",
    "Problem",
    "add_deployment_args",
    "add_engram_args",
    "checked_parts",
    "document_from_args",
    "dp_shared_memory_resolution",
    "engram_environment",
    "load_config",
    "load_deployment",
    "read_deployment",
    "validate_deployment",
    "verify_host_memory",
]

PARTS = ("engram", "model", "parallel", "load", "platform")
MAX_DOCUMENT_BYTES = 64 << 20  # far above any real deployment document; bounds what a mistake can read

Source = Mapping[str, Any] | str | bytes | os.PathLike[str] | None
# (label for messages, field, raw text) of one --engram-config.<field> flag or FIELD=VALUE override.
Override = tuple[str, str, str]

_INPUT_DECODER = msgspec.json.Decoder(EngramConfigInput)
_JSON_DECODER = msgspec.json.Decoder()


def load_config(
    source: Source = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
) -> EngramConfig:
    """An EngramConfig from a dict, JSON text or bytes, or a path to a JSON file, then the environment
    (`env=None` reads os.environ) and `FIELD=VALUE` overrides. Raises ConfigError listing every problem."""
    if env is None:
        env = os.environ
    if not overrides and type(source) is bytes:  # the hot path: one JSON document, nothing to merge
        try:
            fast = _decode_fast(source, env)
        except RecursionError:
            raise _too_deep("source") from None
        if fast is not None:
            return fast
    overrides = _check_arguments(source, env, overrides)
    try:
        parsed = [_split_override(o) for o in overrides]
        document = read_deployment({"engram": _read_object(source, "")}, overrides=parsed)
        return validate_deployment(document, env=env).engram
    except RecursionError:
        raise _too_deep("source") from None


MAX_DEPTH = 100  # far deeper than any deployment document; deeper input is refused before it is walked


def _argument_error(name: str, message: str) -> ConfigError:
    return ConfigError([Problem("", "argument", f"{name}: {message}")])


def _too_deep(name: str) -> ConfigError:
    return _argument_error(name, f"the input nests too deeply (more than {MAX_DEPTH} levels)")


def _check_arguments(source: Any, env: Any, overrides: Any) -> list[str]:
    """The public loaders' arguments, checked before use: a mistake is one ConfigError naming the
    argument, never a TypeError from somewhere inside. Returns the overrides as a list."""
    if not (source is None or isinstance(source, (Mapping, str, bytes, bytearray, memoryview, os.PathLike))):
        raise _argument_error("source", f"expected a dict, JSON text or bytes, or a path; got {type(source).__name__}")
    if isinstance(source, str) and "\0" in source:
        raise _argument_error("source", "contains a NUL character; pass JSON text or a path")
    if isinstance(source, Mapping):
        _check_json_value(source, "source")
    if not isinstance(env, Mapping):
        raise _argument_error("env", f"expected a mapping of variable names to strings; got {type(env).__name__}")
    for key in (variable for variables, _ in ENV_DEFAULTS.values() for variable in variables):
        if key in env and not isinstance(env[key], str):
            raise _argument_error("env", f"{key} must be a string; got {type(env[key]).__name__}")
    return _listed(
        overrides,
        "overrides",
        lambda item: isinstance(item, str),
        "'FIELD=VALUE' strings",
        "each override is a 'FIELD=VALUE' string",
    )


def _listed(value: Any, name: str, is_item: Callable[[Any], bool], items: str, each: str) -> list[Any]:
    """`value` as a list, every element checked: a string where a list belongs, or an element of the wrong
    type, is one ConfigError naming the argument."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _argument_error(name, f"expected a list of {items}; got {type(value).__name__}")
    listed = list(value)
    for element in listed:
        if not is_item(element):
            raise _argument_error(name, f"{each}; got {type(element).__name__}")
    return listed


def _is_override(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 3 and all(isinstance(part, str) for part in item)


def _is_pointer(key: Any) -> bool:
    return isinstance(key, tuple) and all(isinstance(part, str) for part in key)


def _check_json_value(value: Any, name: str) -> None:
    """String keys and a bounded depth, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep(name)
        if isinstance(node, Mapping):
            for key, child in node.items():
                if not isinstance(key, str):
                    raise _argument_error(name, f"object keys must be strings; got {_shown(key)!r}")
                stack.append((child, depth + 1))
        elif isinstance(node, (list, tuple)):
            stack.extend((child, depth + 1) for child in node)


def _decode_fast(data: bytes, env: Mapping[str, str]) -> EngramConfig | None:
    """msgspec checks types and unknown fields in C; None sends the caller to the full walk, which
    then reports every problem instead of msgspec's first."""
    try:
        return resolve_engram_config(_INPUT_DECODER.decode(data), env)  # the rules run as it is built
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


@dataclass(frozen=True)
class Deployment:
    """A validated deployment: the resolved EngramConfig and whichever other parts were given."""

    engram: EngramConfig
    model: ModelConfig | None = None
    parallel: ParallelConfig | None = None
    load: LoadConfig | None = None
    platform: str | None = None
    dp_shared_memory_given: bool | None = None  # as the input said it (null: resolved from the parallel part)

    @property
    def checked(self) -> list[str]:
        return checked_parts({k: getattr(self, k) for k in PARTS})

    @property
    def parallel_size(self) -> int | None:
        return None if self.parallel is None else self.engram.get_parallel_size(self.parallel)


def load_deployment(
    source: Source = None,
    *,
    env: Mapping[str, str] | None = None,
    engram_json: Iterable[str] = (),
    overrides: Iterable[Override] = (),
    flags: Mapping[tuple[str, ...], Any] | None = None,
) -> Deployment:
    """A deployment document (dict, JSON text or bytes, path), then `flags` (pointer -> value, from the
    deployment flags), `engram_json` objects and `overrides` on the engram section. Absent parts are
    not checked. Raises ConfigError listing every problem."""
    _check_arguments(source, os.environ if env is None else env, ())
    engram_json = _listed(
        engram_json, "engram_json", lambda item: isinstance(item, str), "JSON texts", "each item is a JSON object text"
    )
    overrides = _listed(
        overrides,
        "overrides",
        _is_override,
        "(flag, field, value) tuples",
        "each override is a (flag, field, value) tuple of strings",
    )
    if flags is not None and not (isinstance(flags, Mapping) and all(_is_pointer(key) for key in flags)):
        raise _argument_error("flags", "expected a mapping from pointers (tuples of strings) to values")
    try:
        document = read_deployment(source, engram_json=engram_json, overrides=overrides, flags=flags)
        return validate_deployment(document, env=env)
    except RecursionError:
        raise _too_deep("source") from None


def read_deployment(
    source: Source = None,
    *,
    engram_json: Iterable[str] = (),
    overrides: Iterable[Override] = (),
    flags: Mapping[tuple[str, ...], Any] | None = None,
) -> dict[str, Any]:
    """The deployment document with every input applied, not yet validated. A bare EngramConfig (what
    vLLM's --engram-config takes: some key an engram field, none a deployment section) is read as the
    deployment's engram section, so a misspelt field beside the others is named as unknown there."""
    document = _read_object(source, "")
    engram_names = {*SECTIONS["engram"].__struct_fields__, *OLDER_NAMES.get("engram", {})}
    if any(key in engram_names for key in document) and not any(key in PARTS for key in document):
        document = {"engram": document}
    problems: list[Problem] = [
        Problem(f"/{key}", "engram-field-outside-engram", f'{key!r} is an engram setting: put it inside "engram"')
        for key in document
        if key in engram_names
    ]
    for section in OLDER_NAMES:
        if isinstance(document.get(section), dict):
            document[section] = _current_names(section, document[section], problems)
    for pointer, value in (flags or {}).items():
        _set(document, pointer, value, problems)
    engram = document.setdefault("engram", {})
    if isinstance(engram, dict):
        for text in engram_json:
            engram.update(_current_names("engram", _read_object(text, "/engram", label="--engram-config"), problems))
        _apply_overrides(engram, overrides, problems)
    if problems:
        raise ConfigError(problems)
    return document


def validate_deployment(document: dict[str, Any], *, env: Mapping[str, str] | None = None) -> Deployment:
    """Fill environment defaults into the engram section, check the whole document, build the parts."""
    problems: list[Problem] = []
    engram = document.get("engram", {})
    if isinstance(engram, dict):
        _fill_env_defaults(engram, os.environ if env is None else env, problems)
    try:
        with pattern_budget():
            check_document(document, "", problems)
    except PatternTimeout as exc:  # a value no pattern should take seconds over: refused, never a hang
        problems.append(Problem("", "pattern-timeout", str(exc)))
    if problems:
        raise ConfigError(problems)
    parts: dict[str, Any] = {
        key: _convert(key, document.get(key, {})) for key in SECTIONS if key in document or key == "engram"
    }
    given = parts["engram"].dp_shared_memory
    if "parallel" in parts:  # vLLM 0.33 resolves a null dp_shared_memory before its parallel checks
        parts["engram"] = parts["engram"].resolve_dp_shared_memory(parts["parallel"])
    return Deployment(platform=document.get("platform"), dp_shared_memory_given=given, **parts)


def dp_shared_memory_resolution(given: bool | None, resolved: bool | None) -> str | None:
    """The line the commands print when dp_shared_memory was given as null (None when it was not)."""
    if given is not None:
        return None
    if resolved is None:
        return "dp_shared_memory: null, resolved once the parallel sizes are known (give --data-parallel-size)"
    return f"dp_shared_memory: null, resolved to {json.dumps(resolved)} (vLLM's rule, file_backed added: {NULL_RESOLUTION})"


def checked_parts(document: Mapping[str, Any]) -> list[str]:
    """The parts a document gives (engram always: its absent fields take defaults)."""
    return [k for k in PARTS if k == "engram" or document.get(k) is not None]


def engram_flag_inputs(recorded: Iterable[tuple[str, str]] | None) -> tuple[list[str], list[Override]]:
    """Split what add_engram_args recorded into JSON objects and dotted-field overrides, in order."""
    objects: list[str] = []
    fields: list[Override] = []
    for flag, raw in recorded or ():
        if flag == "--engram-config":
            objects.append(raw)
        else:
            fields.append((flag, flag.removeprefix("--engram-config."), raw))
    return objects, fields


def document_from_args(namespace: Any, source: Source) -> dict[str, Any]:
    """`source` with what a command line gave applied: the engram flags, and the deployment flags where
    the parser has them (add_engram_args, add_deployment_args)."""
    objects, fields = engram_flag_inputs(getattr(namespace, "engram_config", None))
    return read_deployment(source, engram_json=objects, overrides=fields, flags=deployment_flag_values(namespace))


def deployment_flag_values(namespace: Any) -> dict[tuple[str, ...], Any]:
    """The deployment flags a user gave, as pointer -> value (JSON-or-file flags already parsed)."""
    values: dict[tuple[str, ...], Any] = {}
    for flag in DEPLOYMENT_FLAGS:
        value = getattr(namespace, "__".join(flag.pointer), None)
        if value is None:
            continue
        values[flag.pointer] = (
            _read_object(value, "/" + "/".join(flag.pointer), label=flag.flag) if flag.kind == "object" else value
        )
    return values


def _convert(section: str, value: dict[str, Any]) -> msgspec.Struct:
    # JSON Schema accepts 2.0 for an integer; msgspec wants an int.
    value = {k: int(v) if k in INTEGER_FIELDS[section] and isinstance(v, float) else v for k, v in value.items()}
    return msgspec.convert(value, SECTIONS[section])


def engram_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that default engram's own fields (ENGRAM_NODE_DIR), not vLLM's: an engine
    plugin reads its section with these, and the engine's own Engram fields as the engine gives them."""
    return {
        name: environ[name]
        for field, (names, _) in ENV_DEFAULTS.items()
        if field not in VLLM_FIELDS
        for name in names
        if name in environ
    }


def _fill_env_defaults(section: dict[str, Any], env: Mapping[str, str], problems: list[Problem]) -> None:
    """Absent fields with environment defaults take them now, so the rules see resolved values."""
    for name, (variables, default) in ENV_DEFAULTS.items():
        if name in section:
            continue
        try:
            if isinstance(default, bool):
                section[name] = env_bool(env, variables, default, f"/engram/{name}")
            else:
                section[name] = env_text(env, variables, default, f"/engram/{name}", FIELD_CHECKS["EngramConfig"][name])
        except ConfigError as exc:
            problems.extend(exc.errors)


def _split_override(text: str) -> Override:
    name, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError([Problem("/engram", "override", f"override {text!r} must look like FIELD=VALUE")])
    return (f"override {text!r}", name.strip(), raw)


def _current_names(section: str, fields: dict[str, Any], problems: list[Problem]) -> dict[str, Any]:
    """`fields` of a deployment section with older field names (thp_packing) under the current ones
    (use_thp); an object that gives both is a problem. A new dict: the caller's is left alone."""
    renamed = OLDER_NAMES.get(section, {})
    out: dict[str, Any] = {}
    for key, value in fields.items():
        current = renamed.get(key, key)
        if current != key and current in fields:
            problems.append(
                Problem(f"/{section}/{key}", "older-name", f"{key} is the older name of {current}: give only {current}")
            )
            continue
        out[current] = value
    return out


def _apply_overrides(section: dict[str, Any], overrides: Iterable[Override], problems: list[Problem]) -> None:
    for label, given, raw in overrides:
        name = OLDER_NAMES.get("engram", {}).get(given, given)
        kind = ENGRAM_FIELDS.get(name)
        if kind is None:
            known = ", ".join(ENGRAM_FIELDS)
            problems.append(
                Problem(
                    f"/engram/{name}",
                    "unknown-field",
                    f"{label}: unknown field {_shown(name)!r}; known fields: {known}",
                )
            )
        elif kind == "boolean" and name in ENGRAM_NULLABLE and raw.strip().lower() == "null":
            section[name] = None
        elif kind == "boolean":
            value = parse_bool(raw)
            if value is None:
                problems.append(Problem(f"/engram/{name}", "type", f"{label}: expected true or false; got {raw!r}"))
            else:
                section[name] = value
        else:
            try:
                section[name] = _JSON_DECODER.decode(raw)
            except msgspec.DecodeError:
                section[name] = raw


def _set(document: dict[str, Any], pointer: tuple[str, ...], value: Any, problems: list[Problem]) -> None:
    *parents, last = pointer
    node = document
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            problems.append(Problem("/" + part, "type", f"expected an object to set {'/'.join(pointer)} in"))
            return
    node[last] = value


def _read_object(source: Source, pointer: str, *, label: str | None = None) -> dict[str, Any]:
    """A JSON object from a mapping, JSON text/bytes, or a file path. Any failure is a ConfigError
    naming where the input came from."""
    where = label or "input"
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
    elif isinstance(source, str) and source.lstrip()[:1] in tuple('{["-0123456789'):
        data = source.encode()
    else:
        path = Path(source)
        where = f"{label + ' ' if label else ''}{str(path)[:300]!r}"
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):  # a FIFO with no writer would block forever
                raise ConfigError([Problem(pointer, "source", f"cannot read {where}: not a regular file")])
            if info.st_size > MAX_DOCUMENT_BYTES:
                raise ConfigError(
                    [
                        Problem(
                            pointer,
                            "source",
                            f"{where} holds {info.st_size:,} bytes; a deployment document is at most {MAX_DOCUMENT_BYTES:,}",
                        )
                    ]
                )
            data = path.read_bytes()
        except OSError as exc:
            raise ConfigError([Problem(pointer, "source", f"cannot read {where}: {exc.strerror or exc}")]) from None
    try:
        value = _JSON_DECODER.decode(data)
    except msgspec.DecodeError as exc:
        raise ConfigError([Problem(pointer, "json", f"{where} is not valid JSON: {exc}")]) from None
    if not isinstance(value, dict):
        raise ConfigError([Problem(pointer, "type", f"{where} must be a JSON object; got {_describe(value)}")])
    return value


def read_json_object(text: str, label: str) -> dict[str, Any]:
    """A JSON object from text (an environment variable's value), bounded like every other input: a
    document nested too deeply or otherwise not an object is one ConfigError naming `label`."""
    try:
        value = _read_object(text.encode(errors="surrogateescape"), "", label=label)
        _check_json_value(value, label)
    except RecursionError:
        raise _too_deep(label) from None
    return value
