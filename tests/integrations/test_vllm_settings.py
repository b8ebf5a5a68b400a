"""The vLLM plugin outside vLLM: its entry point does nothing where vLLM is absent, and its settings (the
`engram` section of --additional-config, or ENGRAM_VLLM_CONFIG) are engram's schema with vLLM's own Engram
fields beside them; what it cannot honour is refused with the reason. (Inside vLLM: tests/vllm.)"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tomllib
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from engram.errors import ConfigError, EngramError
from engram.integrations.vllm import register
from engram.integrations.vllm.settings import ENV, engram_config
from tests.integrations.hostile_modules import Finder, Raises, Unprintable

ROOT = Path(__file__).resolve().parents[2]


def vllm_config(additional: object = None, **fields: object) -> SimpleNamespace:
    engram = SimpleNamespace(cpu_offload=True, embedding_across_dp=False, dp_shared_memory=None, use_thp=False)
    for name, value in fields.items():
        setattr(engram, name, value)
    return SimpleNamespace(additional_config=additional, engram_config=engram)


def test_the_entry_point_is_declared_and_inert_without_vllm() -> None:
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["vllm.general_plugins"]
    assert entry == {"engram": "engram.integrations.vllm:register"}
    assert importlib.util.find_spec("vllm") is None  # this venv: engram alone
    assert register() is None


def test_not_enabled_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert engram_config(vllm_config()) is None
    assert engram_config(vllm_config({"other": 1})) is None


def test_the_section_with_vllms_fields_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    config = engram_config(vllm_config({"engram": {"file_backed": True}}, use_thp=False))
    assert config is not None and (config.use_thp, config.file_backed, config.cpu_offload) == (False, True, True)
    assert engram_config(vllm_config({"engram": {}}, use_thp=True)).use_thp  # type: ignore[union-attr]
    bounded = engram_config(vllm_config({"engram": {"file_backed": True, "file_cache_bytes": 1 << 30}}))
    assert bounded is not None and bounded.file_cache_bytes == 1 << 30
    monkeypatch.setenv(ENV, '{"shard_layout": "vllm"}')
    from_env = engram_config(vllm_config())
    assert from_env is not None and from_env.shard_layout == "vllm"
    with pytest.raises(ConfigError, match=r"^/engram/shard_layout: .*\[enum\]$"):
        engram_config(vllm_config({"engram": {"shard_layout": "rows"}}))
    with pytest.raises(
        ConfigError, match=r"^/engram/file_cache_bytes: .* it requires file_backed=True \(or disk_offload=True\) \["
    ):
        engram_config(vllm_config({"engram": {"file_cache_bytes": 1 << 30}}))


def test_node_dir_from_the_environment_and_vllms_fields_only_from_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """ENGRAM_NODE_DIR reaches engram's own field; a variable defaulting one of vLLM's fields
    (ENGRAM_CPU_OFFLOAD) does not override what vLLM's own config says."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("ENGRAM_NODE_DIR", "/var/lib/engram/node")
    monkeypatch.setenv("ENGRAM_CPU_OFFLOAD", "0")
    config = engram_config(vllm_config({"engram": {"node_sharing": "node"}}))
    assert config is not None and (config.node_dir, config.cpu_offload) == ("/var/lib/engram/node", True)
    monkeypatch.setenv("ENGRAM_NODE_DIR", "var/lib")
    with pytest.raises(ConfigError, match=r"^/engram/node_dir: ENGRAM_NODE_DIR='var/lib': expected a match"):
        engram_config(vllm_config({"engram": {"node_sharing": "node"}}))


def test_sglangs_section_takes_node_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from engram.integrations.sglang.rules import ENV as SGLANG_ENV
    from engram.integrations.sglang.settings import engram_config as sglang_config

    monkeypatch.setenv(SGLANG_ENV, '{"cpu_offload": true, "node_sharing": "node"}')
    monkeypatch.setenv("ENGRAM_NODE_DIR", "/run/a")
    first = sglang_config()
    monkeypatch.setenv("ENGRAM_NODE_DIR", "/run/b")
    second = sglang_config()
    assert first is not None and second is not None and (first.node_dir, second.node_dir) == ("/run/a", "/run/b")


@pytest.mark.parametrize(
    ("additional", "env", "message"),
    [
        (
            {"engram": []},
            None,
            "--additional-config's engram section must be a JSON object of engram settings, got an array",
        ),
        (
            None,
            "{nope",
            f"^: {ENV} is not valid JSON: JSON is malformed: object keys must be strings \\(byte 1\\) \\[json\\]$",
        ),
        (None, "[" * 100_000 + "]" * 100_000, f"^: {ENV}: the input nests too deeply \\(more than 100 levels\\)"),
        (None, '{"a":' * 50_000 + "1" + "}" * 50_000, f"^: {ENV}: the input nests too deeply"),
        (None, '{"file_cache_bytes": ' + "9" * 5000 + "}", f"^: {ENV} is not valid JSON: Integer value out of range"),
        (None, "null", f"^: {ENV} must be a JSON object; got null \\[type\\]$"),
        (
            None,
            '{"device_cache_bytes": 1024, "device_cache_profile": "/tmp/a\\u0000b"}',
            r"^the profile '/tmp/a\\x00b' is not a usable file name \(it holds a NUL byte\)$",
        ),
        (
            {"engram": {"cpu_offload": False}},
            None,
            "engram setting 'cpu_offload' is vLLM's own: give it in --engram-config",
        ),
        (
            {"engram": {"shard_layout": "replica"}},
            None,
            "engram setting 'shard_layout': inside vLLM its own layout decides which rank holds which rows; "
            "'replica' cannot be honoured there, leave it at 'vllm'",
        ),
        (
            {"engram": {"device_cache_bytes": 1, "cache_admission": "static"}},
            None,
            "cache_admission 'static' keeps the rows of a profile: set device_cache_profile to the hot rows "
            "`engram profile --out` wrote for this model, or use cache_admission 'online'",
        ),
        (
            {"engram": {"device_cache_bytes": 1, "device_cache_profile": "/nonexistent/hot.safetensors"}},
            None,
            r"^the profile /nonexistent/hot.safetensors cannot be read: No such file or directory",
        ),
    ],
)
def test_bad_settings_are_one_line(
    additional: object, env: str | None, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env)
    with pytest.raises((EngramError, ConfigError), match=message):
        engram_config(vllm_config(additional))


def fake_vllm(monkeypatch: pytest.MonkeyPatch, version: object) -> None:
    module = types.ModuleType("vllm")
    module.__version__ = version  # type: ignore[attr-defined]
    module.__path__ = []  # a package: its submodules are looked for (and refused below)
    monkeypatch.setitem(sys.modules, "vllm", module)


@pytest.mark.parametrize(
    ("version", "inside", "shown"),
    [
        ("1" * 10_000_000, None, "1" * 200 + "..."),  # int() of it would raise
        ("0.34.0", SystemExit(3), "0.34.0"),  # a vLLM module that exits as it is imported
        ("0.33.1", KeyboardInterrupt(), "0.33.1"),
        ("0.34.0", Unprintable(), "0.34.0"),  # an error whose message cannot be made
        (Raises(), None, "<unprintable>"),
    ],
    ids=["huge-version", "system-exit", "interrupt", "unprintable-error", "unprintable-version"],
)
def test_nothing_escapes_the_entry_point(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    version: object,
    inside: BaseException | None,
    shown: str,
) -> None:
    """Whatever vLLM's version says and whatever its modules raise (SystemExit, KeyboardInterrupt, an
    exception whose message raises), register() returns, and says once why engram stands aside."""
    from engram.integrations import vllm as plugin

    fake_vllm(monkeypatch, version)
    monkeypatch.setattr(plugin, "_warned", set())
    if inside is not None:
        monkeypatch.setattr(sys, "meta_path", [Finder("vllm.model_executor", inside), *sys.meta_path])
    with caplog.at_level(logging.WARNING, logger="engram"):
        assert register() is None
        assert register() is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"engram: vLLM {shown} is installed and "), said
    assert said[0].endswith("; engram leaves vLLM as it is (an engram section would be ignored)")


def test_a_vllm_whose_import_exits_is_not_inside_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder("vllm", SystemExit(1)), *sys.meta_path])
    assert register() is None
