"""`engram demo` end to end, and `engram doctor` on this machine."""

from __future__ import annotations

import dataclasses
import errno
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from engram.apps.demo import cached_checkpoint
from engram.apps.presets import get_preset
from engram.cli import main
from engram.runtime.checkpoints.loader import Checkpoint
from engram.runtime.placement.shm import shm_dir
from tests.config.fields import vllm_digest

TINY = get_preset("tiny").table_bytes


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    code = main(["demo", "--preset", "tiny", "--json", *argv])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    return report  # type: ignore[no-any-return]


def engram_files() -> list[str]:
    return sorted(p.name for p in shm_dir().iterdir() if p.name.startswith("engram-") and p.is_file())


def test_the_cached_checkpoint_follows_the_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A preset whose tables changed shape gets a checkpoint of its own, not the one cached before."""
    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(tmp_path))
    spec = get_preset("tiny")
    first = cached_checkpoint(spec)
    assert cached_checkpoint(spec) == first
    config = {**spec.hf_text_config, "engram_vocab_size": [1_000, 1_600]}  # tiny: [1_000, 1_500]
    grown = dataclasses.replace(spec, hf_text_config=config)
    second = cached_checkpoint(grown)
    assert second != first and first.exists() and second.exists()
    assert Checkpoint(second).shapes != Checkpoint(first).shapes


def test_two_first_runs_at_once_share_one_cached_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both write their own copy of a cold cache's checkpoint; the second rename finds the first's in
    place and uses it."""
    from engram.apps import demo as demo_app

    monkeypatch.setenv("ENGRAM_CACHE_DIR", str(tmp_path))
    both_written = threading.Barrier(2, timeout=60)
    write = demo_app.write_checkpoint

    def write_then_wait(*args: Any, **kwargs: Any) -> Path:
        path = write(*args, **kwargs)
        both_written.wait()  # neither has renamed yet
        return path

    monkeypatch.setattr(demo_app, "write_checkpoint", write_then_wait)
    spec = get_preset("tiny")
    with ThreadPoolExecutor(2) as pool:
        found = [f.result(timeout=120) for f in [pool.submit(cached_checkpoint, spec) for _ in range(2)]]
    assert found[0] == found[1] and Checkpoint(found[0]).shapes
    assert [p.name for p in found[0].parent.iterdir()] == [found[0].name]  # no staging copy left


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
    assert report["hash"] == vllm_digest({"dp_shared_memory": True})
    assert engram_files() == before  # nothing left in the shm directory
    # each replica's tables (EngramTables.stats()): the shared placement, looked up once, then 20 times
    for tables in report["tables"].values():
        assert [t["placement"] for t in tables] == ["shm"] * len(tables) and tables
        assert all(t["lookups"] == 21 and t["tier"] is None and t["disk_bytes_read"] == 0 for t in tables)
    stored = sum(t["bytes"] for t in report["tables"]["0"])  # rows and scales, each part 128-byte aligned
    assert TINY <= stored < TINY + 128 * len(report["tables"]["0"])


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


@pytest.mark.slow
def test_a_null_dp_shared_memory_falls_back_to_private_copies_where_shm_is_too_small(
    capsys: pytest.CaptureFixture[str], small_tmpfs: Callable[[str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    """As vLLM does: null resolves to sharing, and a node that cannot hold the shared tables gives every
    replica a private copy (with a warning) instead of failing; an explicit true still fails there."""
    shm = small_tmpfs("64k")
    code = main(["demo", "--preset", "tiny", "--json", "--engram-config", '{"dp_shared_memory": null}'])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads(captured.out)
    assert report["match"] is True
    for tables in report["tables"].values():
        assert {t["placement"] for t in tables} == {"host"}
    assert list(shm.iterdir()) == []
    assert main(["demo", "--preset", "tiny", "--engram-config", '{"dp_shared_memory": true}']) == 2
    assert f"{shm} has 65,536 bytes free but the shared table needs" in capsys.readouterr().err


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
        "namespaces",
        "node_dir",
        "node copies",
        "CUDA",
        "UVA",
        "nvcc",
        "native CPU kernels",
        "direct reads",
    ]
    assert all(c["status"] in ("pass", "warn") for c in checks)
    assert all(c["fix"] for c in checks if c["status"] == "warn")
    assert checks[-1]["status"] == "pass"  # this kernel has io_uring, and nothing forbids it


def test_doctor_says_where_io_uring_is_forbidden(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox that forbids io_uring_setup answers EPERM (a stand-in kernel call here, not a kernel)."""
    from engram.ops import cpu

    library = cpu.cpu_library()
    assert library is not None

    def forbidden(*args: object) -> int:
        args[-1]._obj.value = errno.EPERM  # type: ignore[attr-defined]  # byref(os_error)'s c_int64
        return cpu.STATUS_IO

    monkeypatch.setattr(library, "engram_read_direct_cpu", forbidden)
    main(["doctor", "--json"])
    check = json.loads(capsys.readouterr().out)[-1]
    assert check == {
        "name": "direct reads",
        "status": "warn",
        "detail": "RAM tiers read their misses through the page cache here: io_uring cannot read here: Operation not permitted",
        "fix": "allow io_uring (Linux 5.11 or newer; a container's seccomp profile, or kernel.io_uring_disabled, can forbid it)",
    }


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


def doctor_checks(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, dict[str, str]]:
    main(["doctor", "--json", "--preset", "tiny", *argv])
    return {c["name"]: c for c in json.loads(capsys.readouterr().out)}


def test_doctor_shows_how_dp_shared_memory_resolves_and_why_it_would_not_share(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A null resolved to true passes where the node can share, warns with vLLM 0.33's veto reason where it
    cannot (and the other checks then see the private copies the replicas fall back to); an explicit true
    fails there; false passes."""
    resolved = "null, resolved to true (vLLM's rule, file_backed added: on exactly when cpu_offload"
    shared = doctor_checks(capsys, "--data-parallel-size", "2")["dp_shared_memory"]
    assert shared["status"] == "pass" and shared["detail"].startswith(resolved)
    lone = doctor_checks(capsys, "--data-parallel-size", "2", "--data-parallel-size-local", "1")["dp_shared_memory"]
    assert lone["status"] == "warn" and lone["detail"].endswith(
        "; but here Engram DP size 1: one replica per node, nobody to share with, so every replica would keep a "
        "private copy (a warning at start-up)"
    )
    monkeypatch.setattr("engram.apps.doctor.shared_capacity_error", lambda size: f"{size:,} bytes do not fit")
    checks = doctor_checks(capsys, "--data-parallel-size", "2")
    assert (
        checks["dp_shared_memory"]["status"] == "warn"
        and "but here 678,214 bytes do not fit"
        in (  # scales 128-aligned per shard
            checks["dp_shared_memory"]["detail"]
        )
    )
    assert checks["shm"]["detail"].endswith("the plan needs 0.0 MiB per node")  # the private fallback's
    explicit = doctor_checks(capsys, "--data-parallel-size", "2", "--engram-config.dp_shared_memory", "true")
    assert explicit["dp_shared_memory"] == {
        "name": "dp_shared_memory",
        "status": "fail",
        "detail": "true, but here 678,214 bytes do not fit",
        "fix": "make room as the reason says, co-locate replicas on a node, or set dp_shared_memory to false",
    }
    off = doctor_checks(capsys, "--data-parallel-size", "2", "--engram-config.dp_shared_memory", "false")
    assert off["dp_shared_memory"]["status"] == "pass"


def test_doctor_says_a_shm_dir_that_is_a_file_is_not_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engram.apps.doctor import check_shm

    for path, what in ((tmp_path / "file", "is not a directory"), (tmp_path / "missing", "does not exist")):
        if what == "is not a directory":
            path.write_bytes(b"")
        monkeypatch.setenv("ENGRAM_SHM_DIR", str(path))
        check = check_shm(None)
        assert (check.status, check.detail) == ("fail", f"{path} {what}")
