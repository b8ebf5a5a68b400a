"""The configuration commands (validate, hash, schema, docs) and `import engram` start without torch:
counted by the modules a fresh interpreter has imported once the command ran, not by a clock. The
package's face resolves every name it exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import engram

HEAVY = ("torch", "numpy", "tokenizers", "safetensors")


def imported_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    found: list[str] = json.loads(done.stdout.splitlines()[-1])
    return found


@pytest.mark.parametrize(
    "argv",
    [["validate", "{doc}"], ["validate", "{doc}", "--json"], ["hash", "{doc}"], ["schema"], ["docs"], ["--help"]],
)
def test_the_configuration_commands_start_without_torch(argv: list[str], tmp_path: Path) -> None:
    doc = tmp_path / "d.json"
    doc.write_text('{"engram": {"cpu_offload": false}, "parallel": {"tensor_parallel_size": 2}}')
    args = [a.format(doc=doc) for a in argv]
    code = (
        "import contextlib, io\nfrom engram.cli import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main({args!r})\n"
        "    except SystemExit:\n        pass"
    )
    assert imported_after(code) == []


def test_import_engram_starts_without_torch_and_its_face_resolves() -> None:
    assert imported_after("import engram; engram.load_config({})") == []
    assert imported_after("import engram; engram.get_preset") == ["numpy", "tokenizers", "torch"]
    for name in engram.__all__:
        assert getattr(engram, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        engram.nothing  # noqa: B018
