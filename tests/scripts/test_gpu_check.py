"""The CPU-side pieces of scripts/gpu_check.py, the GPU acceptance test: guarded stages, the report, exact
comparisons of every dtype, and the placement stage itself run on the CPU (on a GPU it runs on cuda)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from engram.errors import EngramError

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_a_failing_stage_does_not_hide_the_others(gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    report = gpu_check.Report()

    def user_error() -> None:
        raise EngramError("registered host memory is not readable")

    def bug() -> None:
        raise KeyError(8)

    assert report.run("first", lambda: {"rows": 3}).ok
    assert not report.run("second", user_error).ok
    assert not report.run("third", bug).ok
    assert not report.run("fourth", lambda: {"ok": False, "match": False}).ok
    assert report.run("fifth", lambda: None).ok
    assert [s.name for s in report.stages] == ["first", "second", "third", "fourth", "fifth"]
    assert [s.ok for s in report.stages] == [True, False, False, False, True]
    assert report.stages[0].detail == {"rows": 3} and report.stages[3].detail == {"match": False}
    assert report.stages[1].error == "registered host memory is not readable"
    assert report.stages[2].error.splitlines()[-1] == "KeyError: 8"  # a bug keeps its traceback
    assert report.ok is False
    document = json.loads(json.dumps(report.as_dict()))
    assert document["ok"] is False and [s["ok"] for s in document["stages"]] == [True, False, False, False, True]
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith("  FAIL second (") and printed[1].endswith("registered host memory is not readable")
    assert printed[2].endswith("KeyError: 8")
    assert gpu_check.Report().ok is False  # no stage run is no pass


def test_same_bits_every_dtype(gpu_check: ModuleType) -> None:
    ids = torch.tensor([[1, -1], [7, 1 << 40]])
    assert gpu_check.same_bits(ids, ids.clone())  # int64: the KeyError 8 of the first H200 run
    assert not gpu_check.same_bits(ids, ids + 1)
    assert not gpu_check.same_bits(ids, ids.to(torch.int32))
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
        values = torch.tensor([0.0, -0.0, float("nan"), 1.5], dtype=dtype)
        assert gpu_check.same_bits(values, values.clone())
        assert gpu_check.same_bits(values, torch.tensor([0.0, -0.0, -float("nan"), 1.5], dtype=dtype))
        assert not gpu_check.same_bits(
            values, torch.tensor([-0.0, -0.0, float("nan"), 1.5], dtype=dtype)
        )  # sign of zero
        assert not gpu_check.same_bits(values, torch.tensor([0.0, -0.0, 2.0, 1.5], dtype=dtype))


def test_every_placement_is_checked(gpu_check: ModuleType) -> None:
    labels = [p[0] for p in gpu_check.PLACEMENTS]
    configs = [(p[1], p[2], p[3]) for p in gpu_check.PLACEMENTS]
    assert ({}, 1, 1) in configs and ({"cpu_offload": False}, 1, 1) in configs
    assert ({"use_thp": True}, 1, 1) in configs and ({"dp_shared_memory": True}, 1, 2) in configs
    assert ({"embedding_across_dp": True}, 1, 2) in configs and ({}, 2, 1) in configs
    assert all("graph" in p[4] for p in gpu_check.PLACEMENTS) and len(set(labels)) == len(labels)


@pytest.mark.slow
@pytest.mark.parametrize("index", [3, 5])  # shm shared by two processes; TP 2 with collectives
def test_placement_stage_on_the_cpu(gpu_check: ModuleType, tmp_path: Path, index: int) -> None:
    """The stage the GPU runs, run here on the CPU from a checkpoint `engram make-checkpoint` wrote."""
    checkpoint = gpu_check.write_checkpoint_cli("tiny", tmp_path / "ckpt")
    assert (checkpoint / "model.safetensors").is_file()
    _, engram, tp, dp, extras = gpu_check.PLACEMENTS[index]
    result = gpu_check.check_placement("tiny", checkpoint, engram, tp, dp, extras, "cpu")
    assert result["ok"] is True and result["match"] is True and result["failed_checks"] == []
    assert result["device"] == "cpu" and result["backend"].startswith("gloo")
    assert result["checks"] == {"graph": ["needs a CUDA device"] * (tp * dp)}
    assert result["placement"] == ("shm" if engram.get("dp_shared_memory") else "host")


def test_stage_groups_are_selected_by_name_or_prefix(gpu_check: ModuleType) -> None:
    groups = gpu_check.GROUPS
    assert gpu_check.selected_groups(None, []) == set(groups)
    assert gpu_check.selected_groups(["kernels", "hash", "placements", "file"], []) == {
        "kernels",
        "hash",
        "placements",
        "file",
    }
    benches = {g for g in groups if g.startswith("bench-")}
    assert gpu_check.selected_groups(["bench"], []) == benches and len(benches) == 7
    assert gpu_check.selected_groups(["bench"], ["bench-cache"]) == benches - {"bench-cache"}
    assert gpu_check.selected_groups(["bench-host"], []) == {"bench-host", "bench-host-pages"}  # a prefix
    assert gpu_check.selected_groups(None, ["bench"]) == set(groups) - benches
    with pytest.raises(SystemExit) as raised:
        gpu_check.selected_groups(["kernel"], [])
    assert str(raised.value) == f"gpu_check: unknown stage group kernel; choose from {', '.join(groups)}"


def test_the_vllm_stage_says_it_was_skipped_without_vllm(gpu_check: ModuleType) -> None:
    """engram's own venv has no vLLM (it lives in .venv-vllm): the stage passes as skipped, and says why."""
    assert importlib.util.find_spec("vllm") is None
    assert "vllm" in gpu_check.GROUPS
    assert gpu_check.check_vllm_plugin() == {
        "skipped": "vLLM is not installed in this Python (pip install vllm==0.33.0 to run this stage)"
    }


def test_the_json_report_is_rewritten_after_every_stage(gpu_check: ModuleType, tmp_path: Path) -> None:
    """A run cut short by the GPU window's limit keeps what it measured: the file holds every finished stage."""
    out = tmp_path / "gpu.json"
    report = gpu_check.Report(groups={"kernels"}, json_path=out)
    seen: list[list[str]] = []

    def second() -> dict[str, int]:
        seen.append([s["name"] for s in json.loads(out.read_text())["stages"]])
        return {"rows": 2}

    report.run("first", lambda: {"rows": 1})
    report.run("second", second)
    assert seen == [["first"]]
    document = json.loads(out.read_text())
    assert [s["name"] for s in document["stages"]] == ["first", "second"] and document["groups"] == ["kernels"]
    assert report.wants("kernels") and not report.wants("bench-cache", "hash")
    assert not list(tmp_path.glob("*.part"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the script runs instead")
def test_without_a_gpu_the_script_says_so(gpu_check: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--only", "kernels"]) == 2
    assert capsys.readouterr().err == "gpu_check: no CUDA device here; run it on a GPU machine\n"
