"""engram installed as users install it: a wheel built from a copy of the repository, installed into a fresh
venv (its dependencies taken from this one), run outside the checkout. The wheel carries the kernel
sources, the installed engram builds its native CPU kernels into its own cache, and a file-backed fp8
table at a row offset returns the checkpoint's rows (tests/runtime/reference.py), bit for bit."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.bits import same_bits
from tests.runtime.reference import dequantise, pick, read_tensors

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")

CHILD = """
import json, sys
from pathlib import Path
import torch
from safetensors.torch import save_file
import engram
from engram.apps.presets import get_preset
from engram.ops import cpu, gather
from engram.ops.build import KERNELS
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.embedding import EngramEmbedding
from engram.runtime.plan import table_shards
from engram.runtime.rank_tables import open_tables

out = Path(sys.argv[1])
spec = get_preset("tiny")
write_checkpoint(spec, out / "checkpoint", seed=4)
plans = table_shards(spec, 1, 2, rows_only=True)  # the second half of each table's rows
shards = open_tables(spec, Checkpoint(out / "checkpoint"), "file", plans=plans, progress=False)
plan, shard = plans[0], shards[0]
ids = torch.randint(-1, plan.table_rows, (64, spec.layout.columns), generator=torch.Generator().manual_seed(3))
rows = EngramEmbedding(shard, plan, columns=spec.layout.columns)(ids)
raw = gather(shard.weight, None, ids, plan.row_start, plan.table_rows, shard.weight.dtype)
save_file({"ids": ids, "rows": rows, "raw": raw.view(torch.uint8)}, str(out / "rows.safetensors"))
print(json.dumps({"engram": engram.__file__, "kernels": str(KERNELS), "native": cpu.cpu_library() is not None,
                  "table": plan.table, "row_start": plan.row_start, "row_stop": plan.row_stop}))
"""


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-4000:])
    return done  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_serves_a_file_backed_fp8_table(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=SKIP, symlinks=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ]
    )
    [wheel] = tmp_path.glob("engram-*.whl")
    shipped = zipfile.ZipFile(wheel).namelist()
    for kernel in (ROOT / "kernels").rglob("*"):
        if kernel.is_file():
            assert f"engram/_kernels/{kernel.relative_to(ROOT / 'kernels').as_posix()}" in shipped

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)])
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip())
    # This venv's packages (torch, safetensors, ...) for the dependencies: a plain path entry, so their .pth
    # files (this checkout's editable install among them) are not run and engram is the wheel's alone.
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ENGRAM_CACHE_DIR": str(tmp_path / "cache")}
    report = json.loads(run([str(python), "-c", CHILD, str(work)], cwd=work, env=env).stdout.splitlines()[-1])

    assert Path(report["engram"]).is_relative_to(site) and Path(report["kernels"]) == site / "engram" / "_kernels"
    assert report["native"] is True and len(list((tmp_path / "cache" / "build").glob("libengram_cpu-*.so"))) == 1
    got = load_file(str(work / "rows.safetensors"))
    ids, start, stop = got["ids"], report["row_start"], report["row_stop"]
    assert start > 0
    tensors = read_tensors(work / "checkpoint")
    owned = ((ids >= start) & (ids < stop))[..., None]
    full = pick(dequantise(tensors, report["table"], "fp8", torch.bfloat16), ids)
    assert same_bits(got["rows"], torch.where(owned, full, torch.zeros((), dtype=torch.bfloat16)))
    weight = tensors[f"{report['table']}.weight"].view(torch.uint8)
    raw = torch.where(owned, weight[ids.clamp(min=0)], torch.zeros((), dtype=torch.uint8))
    assert torch.equal(got["raw"], raw)
