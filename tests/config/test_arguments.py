"""The Python API's arguments: every mistake is one ConfigError naming the argument, never a TypeError,
AttributeError, ValueError or RecursionError from inside."""

from __future__ import annotations

from typing import Any

import pytest

from engram.config import load_config, load_deployment
from engram.errors import ConfigError


def deep_dict(levels: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return top


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"env": ["ENGRAM_CPU_OFFLOAD"]}, "env: expected a mapping of variable names to strings; got list"),
        ({"env": {"ENGRAM_CPU_OFFLOAD": 1}}, "env: ENGRAM_CPU_OFFLOAD must be a string; got int"),
        ({"overrides": b"cpu_offload=true"}, "overrides: expected a list of 'FIELD=VALUE' strings; got bytes"),
        ({"overrides": "cpu_offload=true"}, "overrides: expected a list of 'FIELD=VALUE' strings; got str"),
        ({"overrides": [None]}, "overrides: each override is a 'FIELD=VALUE' string; got NoneType"),
        ({"overrides": None}, "overrides: expected a list of 'FIELD=VALUE' strings; got NoneType"),
        ({"source": {1: True}}, "source: object keys must be strings; got 1"),
        ({"source": "config\0.json"}, "source: contains a NUL character; pass JSON text or a path"),
        ({"source": 5}, "source: expected a dict, JSON text or bytes, or a path; got int"),
        ({"source": "[" * 100_000 + "]" * 100_000}, "source: the input nests too deeply (more than 100 levels)"),
        (
            {"source": b'{"a":' * 100_000 + b"1" + b"}" * 100_000},
            "source: the input nests too deeply (more than 100 levels)",
        ),
        ({"source": deep_dict(200)}, "source: the input nests too deeply (more than 100 levels)"),
    ],
)
def test_load_config_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(**{"source": {}, "env": {}, **kwargs})
    assert [(p.path, p.rule, p.message) for p in exc.value.errors] == [("", "argument", message)]


def test_load_deployment_arguments() -> None:
    with pytest.raises(ConfigError, match=r"source: object keys must be strings; got 3"):
        load_deployment({"engram": {3: 4}}, env={})
    with pytest.raises(ConfigError, match=r"env: expected a mapping"):
        load_deployment({}, env="ENGRAM_CPU_OFFLOAD=1")  # type: ignore[arg-type]
    assert load_deployment({"engram": {"cpu_offload": False}}, env={}).engram.cpu_offload is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engram_json": '{"cpu_offload": false}'}, "engram_json: expected a list of JSON texts; got str"),
        ({"engram_json": [{"cpu_offload": False}]}, "engram_json: each item is a JSON object text; got dict"),
        ({"engram_json": 5}, "engram_json: expected a list of JSON texts; got int"),
        (
            {"overrides": ["cpu_offload=false"]},
            "overrides: each override is a (flag, field, value) tuple of strings; got str",
        ),
        (
            {"overrides": [("--x", "cpu_offload")]},
            "overrides: each override is a (flag, field, value) tuple of strings; got tuple",
        ),
        ({"overrides": "cpu_offload=false"}, "overrides: expected a list of (flag, field, value) tuples; got str"),
        ({"flags": {"parallel": 2}}, "flags: expected a mapping from pointers (tuples of strings) to values"),
        ({"flags": [("parallel",)]}, "flags: expected a mapping from pointers (tuples of strings) to values"),
    ],
)
def test_load_deployment_list_arguments_are_typed(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_deployment({}, env={}, **kwargs)
    assert [(p.path, p.rule, p.message) for p in exc.value.errors] == [("", "argument", message)]
    flag = ("--engram-config.cpu_offload", "cpu_offload", "false")
    assert (
        load_deployment({}, env={}, engram_json=['{"file_backed": false}'], overrides=[flag]).engram.cpu_offload
        is False
    )
