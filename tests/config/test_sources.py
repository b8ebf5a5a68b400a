"""load_config's sources and overrides, and the errors for unreadable or malformed input."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram.config import ConfigError, EngramConfig, load_config
from tests.config.fields import KNOWN_FIELDS

SHARED = EngramConfig(cpu_offload=True, embedding_across_dp=False, dp_shared_memory=True, use_thp=False)


def test_every_source_kind(tmp_path: Path) -> None:
    path = tmp_path / "engram.json"
    path.write_text('{"dp_shared_memory": true}')
    for source in (
        {"dp_shared_memory": True},
        '{"dp_shared_memory": true}',
        b'{"dp_shared_memory": true}',
        path,
        str(path),
    ):
        assert load_config(source, env={}) == SHARED


def test_overrides_apply_in_order() -> None:
    assert load_config(
        env={}, overrides=["dp_shared_memory=true", "dp_shared_memory=0", "use_thp=yes"]
    ) == EngramConfig(use_thp=True, dp_shared_memory=False)
    assert load_config({"dp_shared_memory": False}, env={}, overrides=["dp_shared_memory=null"]) == EngramConfig()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["dp_shared_memory"], ("/engram", "override", "override 'dp_shared_memory' must look like FIELD=VALUE")),
        (
            ["nope=1"],
            (
                "/engram/nope",
                "unknown-field",
                f"override 'nope=1': unknown field 'nope'; known fields: {KNOWN_FIELDS}",
            ),
        ),
        (
            ["use_thp=maybe"],
            ("/engram/use_thp", "type", "override 'use_thp=maybe': expected true or false; got 'maybe'"),
        ),
    ],
)
def test_bad_overrides(overrides: list[str], expected: tuple[str, str, str]) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={}, overrides=overrides)
    assert [tuple(p) for p in exc.value.errors] == [expected]


@pytest.mark.parametrize(
    ("source", "rule", "message"),
    [
        (b'{"cpu_offload": tru', "json", "input is not valid JSON: "),
        (b"[1, 2]", "type", "input must be a JSON object; got an array"),
        (b"\xff\xfe", "json", "input is not valid JSON: "),
        ('{"a": ', "json", "input is not valid JSON: "),
    ],
)
def test_malformed(source: object, rule: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(source, env={})  # type: ignore[arg-type]
    (problem,) = exc.value.errors
    assert (problem.path, problem.rule) == ("", rule)
    assert problem.message.startswith(message)


def test_unreadable_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    with pytest.raises(ConfigError) as exc:
        load_config(missing, env={})
    assert [tuple(p) for p in exc.value.errors] == [
        ("", "source", f"cannot read {str(missing)!r}: No such file or directory")
    ]
