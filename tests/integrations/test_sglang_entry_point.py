"""The SGLang plugin's entry point outside SGLang: declared under sglang.srt.plugins, inert where SGLang is
absent, and never raising whatever SGLang is installed (another version, internals that moved, modules
that raise SystemExit or KeyboardInterrupt, versions and errors whose text cannot be made); on a version
it does not serve it says so once, as an error where ENGRAM_SGLANG_CONFIG asks for it. (Inside SGLang:
tests/sglang.)"""

from __future__ import annotations

import importlib.util
import logging
import sys
import tomllib
import types
from pathlib import Path

import pytest

from engram.integrations import sglang as plugin
from engram.integrations.sglang import register
from tests.integrations.hostile_modules import Finder, Raises, Unprintable

ROOT = Path(__file__).resolve().parents[2]


def fake_sglang(monkeypatch: pytest.MonkeyPatch, version: object) -> None:
    module = types.ModuleType("sglang")
    module.__version__ = version  # type: ignore[attr-defined]
    module.__path__ = []  # a package: its submodules are looked for (and refused below)
    monkeypatch.setitem(sys.modules, "sglang", module)
    monkeypatch.setattr(plugin, "_said", set())


def test_the_entry_point_is_declared_and_inert_without_sglang() -> None:
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["sglang.srt.plugins"]
    assert entry == {"engram": "engram.integrations.sglang:register"}
    assert importlib.util.find_spec("sglang") is None  # this venv: engram alone
    assert register() is None


@pytest.mark.parametrize(
    ("version", "inside", "shown", "problem"),
    [
        ("0.5.22", None, "0.5.22", "engram serves SGLang 0.5.23 only"),
        ("0.5.230", None, "0.5.230", "engram serves SGLang 0.5.23 only"),
        ("9" * 10_000_000, None, "9" * 200 + "...", "engram serves SGLang 0.5.23 only"),
        (Raises(), None, "<unprintable>", "engram serves SGLang 0.5.23 only"),
        ("0.5.23", SystemExit(3), "0.5.23", "its Engram internals are not what engram expects (SystemExit: 3)"),
        (
            "0.5.23",
            KeyboardInterrupt(),
            "0.5.23",
            "its Engram internals are not what engram expects (KeyboardInterrupt: )",
        ),
        (
            "0.5.23",
            Unprintable(),
            "0.5.23",
            "its Engram internals are not what engram expects (Unprintable: <unprintable>)",
        ),
    ],
    ids=["older", "longer", "huge", "unprintable-version", "system-exit", "interrupt", "unprintable-error"],
)
def test_nothing_escapes_and_engram_stands_aside_once(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    version: object,
    inside: BaseException | None,
    shown: str,
    problem: str,
) -> None:
    fake_sglang(monkeypatch, version)
    monkeypatch.delenv("ENGRAM_SGLANG_CONFIG", raising=False)
    if inside is not None:
        monkeypatch.setattr(sys, "meta_path", [Finder("sglang.srt", inside), *sys.meta_path])
    with caplog.at_level(logging.WARNING, logger="engram"):
        assert register() is None
        assert register() is None
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"engram: SGLang {shown} is installed and {problem}; engram leaves SGLang as it is")
    ]


def test_a_section_for_a_sglang_engram_does_not_serve_is_an_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake_sglang(monkeypatch, "0.6.0")
    monkeypatch.setenv("ENGRAM_SGLANG_CONFIG", '{"cpu_offload": true}')
    with caplog.at_level(logging.WARNING, logger="engram"):
        assert register() is None
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        (
            "ERROR",
            "engram: SGLang 0.6.0 is installed and engram serves SGLang 0.5.23 only, so ENGRAM_SGLANG_CONFIG is not "
            "served: install SGLang 0.5.23 beside engram, or unset ENGRAM_SGLANG_CONFIG",
        )
    ]


def test_a_sglang_whose_import_exits_is_not_inside_sglang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder("sglang", SystemExit(1)), *sys.meta_path])
    assert register() is None
