"""cpu_offload's default: ENGRAM_CPU_OFFLOAD, then VLLM_PLE_CPU_OFFLOAD, then true; explicit wins."""

from __future__ import annotations

import pytest

from engram.config import ConfigError, load_config

SPELLINGS = [
    ("1", True),
    ("true", True),
    ("YES", True),
    (" On ", True),
    ("0", False),
    ("False", False),
    ("no", False),
    ("OFF", False),
]


@pytest.mark.parametrize(("text", "value"), SPELLINGS)
@pytest.mark.parametrize("name", ["ENGRAM_CPU_OFFLOAD", "VLLM_PLE_CPU_OFFLOAD"])
@pytest.mark.parametrize("source", [None, {}, b"{}", "{}"])
def test_each_variable_and_spelling(name: str, text: str, value: bool, source: object) -> None:
    assert load_config(source, env={name: text}).cpu_offload is value  # type: ignore[arg-type]


def test_engram_variable_beats_legacy() -> None:
    env = {"ENGRAM_CPU_OFFLOAD": "0", "VLLM_PLE_CPU_OFFLOAD": "1"}
    assert load_config(env=env).cpu_offload is False
    assert load_config(b"{}", env={**env, "ENGRAM_CPU_OFFLOAD": "1", "VLLM_PLE_CPU_OFFLOAD": "0"}).cpu_offload is True


@pytest.mark.parametrize("source", [{"cpu_offload": True}, b'{"cpu_offload": true}'])
def test_explicit_beats_environment(source: object) -> None:
    assert load_config(source, env={"ENGRAM_CPU_OFFLOAD": "0", "VLLM_PLE_CPU_OFFLOAD": "0"}).cpu_offload is True  # type: ignore[arg-type]
    assert load_config({"cpu_offload": False}, env={"ENGRAM_CPU_OFFLOAD": "1"}).cpu_offload is False


def test_override_beats_document_and_environment() -> None:
    config = load_config({"cpu_offload": True}, env={"ENGRAM_CPU_OFFLOAD": "1"}, overrides=["cpu_offload=false"])
    assert config.cpu_offload is False


def test_bad_value_names_the_variable() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={"VLLM_PLE_CPU_OFFLOAD": "maybe"})
    assert [tuple(p) for p in exc.value.errors] == [
        (
            "/engram/cpu_offload",
            "env-bool",
            "VLLM_PLE_CPU_OFFLOAD='maybe' is not a boolean; use 1/true/yes/on or 0/false/no/off, or unset it",
        )
    ]
    with pytest.raises(ConfigError, match="ENGRAM_CPU_OFFLOAD=''"):
        load_config(b"{}", env={"ENGRAM_CPU_OFFLOAD": ""})


def test_bad_variable_ignored_when_explicit() -> None:
    assert load_config({"cpu_offload": True}, env={"ENGRAM_CPU_OFFLOAD": "maybe"}).cpu_offload is True


def test_environment_default_feeds_the_rules() -> None:
    with pytest.raises(
        ConfigError, match=r"dp_shared_memory requires cpu_offload=True \[dp-shared-memory-needs-cpu-offload\]"
    ):
        load_config(b'{"dp_shared_memory": true}', env={"ENGRAM_CPU_OFFLOAD": "off"})


def test_env_none_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_CPU_OFFLOAD", "0")
    assert load_config().cpu_offload is False
    assert load_config(env={}).cpu_offload is True
