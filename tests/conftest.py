"""Shared fixtures. Tests never depend on the caller's environment: Engram variables are cleared."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _clean_engram_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ENGRAM_CPU_OFFLOAD", "VLLM_PLE_CPU_OFFLOAD", "ENGRAM_SHM_DIR"):
        monkeypatch.delenv(name, raising=False)
