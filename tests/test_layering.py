"""The package's floors: engram/memory imports nothing above it, ops never imports the CUDA kernels, and
the host-memory check knows no generated struct (the import circles the probe found stay gone)."""

from __future__ import annotations

import ast
from pathlib import Path

ENGRAM = Path(__file__).resolve().parents[1] / "engram"


def imported(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def test_the_memory_floor_imports_nothing_above_it() -> None:
    above = {
        module
        for path in (ENGRAM / "memory").glob("*.py")
        for module in imported(path)
        if module.startswith("engram") and not module.startswith(("engram.memory", "engram.errors"))
    }
    assert above == set()


def test_no_import_circles_between_ops_and_kernels_or_host_and_structs() -> None:
    assert "engram.kernels" not in imported(ENGRAM / "ops.py")
    assert not any(m.startswith("engram._generated") for m in imported(ENGRAM / "memory" / "host.py"))
