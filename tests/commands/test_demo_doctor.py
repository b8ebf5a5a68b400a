"""`engram demo` end to end, and `engram doctor` on this machine."""

from __future__ import annotations

import json

import pytest
import torch

from engram.apps.presets import get_preset
from engram.cli import main
from engram.runtime.placement.shm import shm_dir

TINY = get_preset("tiny").table_bytes


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    code = main(["demo", "--preset", "tiny", "--json", *argv])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    return report  # type: ignore[no-any-return]


def engram_files() -> list[str]:
    return sorted(p.name for p in shm_dir().iterdir() if p.name.startswith("engram-") and p.is_file())


@pytest.mark.slow
def test_demo_shared_tables(capsys: pytest.CaptureFixture[str]) -> None:
    before = engram_files()
    report = demo(capsys)
    assert report["match"] is True
    assert report["placement"] == "shm" and report["engram"]["dp_shared_memory"] is True
    assert report["device"] == "cpu" and report["backend"] == "gloo" and report["checks"] == {}
    assert report["table_bytes"] == TINY == 678_150
    assert TINY <= report["host_pss_bytes"] < 1.15 * TINY
    assert report["private_estimate_bytes"] == 2 * TINY
    assert report["load_seconds"] > 0 and report["lookups_per_second"] > 0
    assert report["hash"] == "0103d4fb0b496f6466971874ca0a01faaac0bac227aafbae6f39e56a1dc1bbb0"
    assert engram_files() == before  # nothing left in the shm directory


@pytest.mark.slow
def test_demo_private_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """Unshared tables at DP 2: vLLM 0.33's layout splits one copy's heads over both replicas; the seed's
    replica layout gives each its own."""
    report = demo(capsys, "--engram-config.dp_shared_memory", "false")
    assert report["match"] is True and report["placement"] == "host"
    assert 0.9 * TINY <= report["host_pss_bytes"] <= 1.1 * TINY
    report = demo(capsys, "--engram-config", '{"dp_shared_memory": false, "shard_layout": "replica"}')
    assert report["match"] is True and report["placement"] == "host"
    assert 1.9 * TINY <= report["host_pss_bytes"] <= 2.1 * TINY


@pytest.mark.slow
def test_demo_across_dp_and_tp(capsys: pytest.CaptureFixture[str]) -> None:
    report = demo(
        capsys,
        "--tp",
        "2",
        "--engram-config",
        '{"embedding_across_dp": true, "dp_shared_memory": false, "use_thp": true}',
    )
    assert report["match"] is True and report["placement"] == "hugepages"
    assert report["tensor_parallel_size"] == 2 and report["engram"]["embedding_across_dp"] is True


def test_demo_refuses_an_invalid_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--preset", "tiny", "--dp", "1", "--engram-config.dp_shared_memory", "true"]) == 2
    assert "dp_shared_memory requires data_parallel_size > 1." in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the demo runs on it")
def test_demo_on_cuda_without_a_gpu_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--preset", "tiny", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (
        "error: device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu\n"
    )


def test_doctor_passes_here_with_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)
    names = [c["name"] for c in checks]
    assert names == [
        "shm",
        "transparent huge pages",
        "memlock limit",
        "host memory",
        "node identity",
        "CUDA",
        "UVA",
        "nvcc",
        "native CPU kernels",
    ]
    assert all(c["status"] in ("pass", "warn") for c in checks)
    assert all(c["fix"] for c in checks if c["status"] == "warn")


def test_doctor_against_a_plan_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "doctor",
                "--json",
                "--preset",
                "deepseek-v4.1-flash",
                "--tensor-parallel-size",
                "4",
                "--data-parallel-size",
                "8",
                "--engram-config.dp_shared_memory",
                "false",
            ]
        )
        == 1
    )
    memory = next(c for c in json.loads(capsys.readouterr().out) if c["name"] == "host memory")
    assert (
        memory["status"] == "fail" and "the plan pins 188.8 GiB per node" in memory["detail"]
    )  # one copy per node (vLLM 0.33 layout)
