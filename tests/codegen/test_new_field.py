"""docs/architecture.md's promise: a new config field changes no test. A copy of the project gains one
field in its schema (an engram field that opts out of the digest, as engram's own fields do), is
regenerated, and the tests that list fields, show defaults or print the config pass there unchanged (all
but the fuzzing, which lists none)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIELD_TESTS = ["tests/config/test_cli.py", "tests/config/test_structs.py", "tests/codegen/test_generator.py"]


@pytest.mark.slow
def test_a_new_field_changes_no_test(tmp_path: Path) -> None:
    copy = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", ".mypy_cache")
    for part in ("schema", "codegen", "engram", "tests", "docs", "kernels"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore, symlinks=True)
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    schema = copy / "schema" / "engram.schema.json"
    document = json.loads(schema.read_text())
    document["$defs"]["EngramConfig"]["properties"]["probe_reads"] = {
        "type": "boolean",
        "default": False,
        "description": "A field the test adds.",
        "x-engram-hash": {"exclude": "the test's field changes no row"},
    }
    schema.write_text(json.dumps(document, indent=2) + "\n")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    made = subprocess.run(
        [sys.executable, "-m", "codegen"], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert "probe_reads" in (copy / "engram" / "_generated" / "structs.py").read_text()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not fuzz", *FIELD_TESTS],
        cwd=copy, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:]
