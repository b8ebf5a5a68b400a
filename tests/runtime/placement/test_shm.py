"""dp_shared_memory with real processes (spawn, gloo on 127.0.0.1): one copy per node, exact bytes,
nothing left in the shm directory, clear errors when a peer dies or space runs out."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from engram.apps.local_ranks import run_local, values
from engram.runtime.shard import ShardFormat
from tests.runtime import workers
from tests.runtime.shards import checkpoint_digests
from tests.runtime.specs import SMALL

TABLE_BYTES = sum(ShardFormat(rows, SMALL.head_dim, SMALL.dtype).nbytes for rows in SMALL.layout.table_rows)
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("dp", [4])  # four holders: each holds a quarter; two would add nothing (suite time)
def test_shared_tables_one_copy_per_node(dp: int, small_checkpoint: Path, shm_tmp: Path) -> None:
    results = values(run_local(dp, workers.load_tables, SMALL, str(small_checkpoint), "shm", timeout=240))
    expected = checkpoint_digests(small_checkpoint, SMALL)
    assert all(r["digests"] == expected for r in results)  # every replica reads the checkpoint's bytes
    assert all(r["left_in_shm"] == [] for r in results)  # the name is gone once setup ends
    total_pss = sum(r["pss"] for r in results)
    assert TABLE_BYTES * 0.99 <= total_pss < TABLE_BYTES * 1.15, (total_pss, TABLE_BYTES)
    assert list(shm_tmp.iterdir()) == []


def test_private_tables_cost_dp_copies(small_checkpoint: Path, shm_tmp: Path) -> None:
    results = values(run_local(2, workers.load_tables, SMALL, str(small_checkpoint), "host", timeout=240))
    expected = checkpoint_digests(small_checkpoint, SMALL)
    assert all(r["digests"] == expected for r in results)
    total_pss = sum(r["pss"] for r in results)
    assert 2 * TABLE_BYTES * 0.99 <= total_pss <= 2 * TABLE_BYTES * 1.01 + 2 * 4096 * 4, (total_pss, TABLE_BYTES)


def test_leader_killed_mid_load(small_checkpoint: Path, shm_tmp: Path, tmp_path: Path) -> None:
    signal = tmp_path / "leader-loading"
    pids: list[int] = []

    def kill_leader_when_loading(procs: list) -> None:  # type: ignore[type-arg]
        pids.extend(p.pid for p in procs)
        deadline = time.monotonic() + 120
        while not signal.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert signal.exists(), "the leader never started loading"
        os.kill(procs[0].pid, 9)

    outcomes = run_local(
        3, workers.load_then_stall, SMALL, str(small_checkpoint), str(signal),
        timeout=120, env={"ENGRAM_DIST_TIMEOUT_S": "20"}, on_start=kill_leader_when_loading,
    )  # fmt: skip
    assert outcomes[0].exitcode == -9
    for survivor in outcomes[1:]:  # stopped, or the first to see gloo's connection to rank 0 break: one line
        assert (
            survivor.error == f"rank {survivor.rank} was stopped: rank 0 died with exit code -9 before reporting"
            or (
                survivor.error is not None
                and survivor.error.startswith(
                    "engram shared tables (test): ranks [0, 1, 2] did not all reach 'load layers.1.engram.embed.scale' "
                    f"within 20 s (this is rank {survivor.rank}): "
                )
                and "\n" not in survivor.error
            )
        )
    assert list(shm_tmp.iterdir()) == []
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


@pytest.fixture
def tiny_tmpfs(small_tmpfs: Callable[[str], Path]) -> Path:
    return small_tmpfs("1m")


def test_shm_too_small_is_a_clear_error(tiny_tmpfs: Path) -> None:
    outcomes = run_local(2, workers.allocate_only, 100_000, timeout=120)  # 100,000 rows x 33 B: 3.3 MB > 1 MiB
    for outcome in outcomes:
        assert outcome.exitcode == 0  # an error, never SIGBUS
        assert outcome.error is not None
        assert outcome.error.startswith(
            f"engram shared tables (test): leader rank 0 could not create the shared table big: {tiny_tmpfs} has "
        )
        assert "bytes free but the shared table needs 3,300,000" in outcome.error
        assert "--shm-size" in outcome.error and "--ipc=host" in outcome.error
    assert list(tiny_tmpfs.iterdir()) == []


def test_replicas_on_different_nodes_are_refused(shm_tmp: Path) -> None:
    outcomes = run_local(2, workers.allocate_as_node, timeout=120)
    for outcome in outcomes:
        assert outcome.error == (
            "engram shared tables (test): rank 1: rank 1 runs on another node than its leader (boot id differs); "
            "dp_shared_memory needs data_parallel_size_local to match the replicas per node"
        )
    assert list(shm_tmp.iterdir()) == []


@pytest.mark.slow
def test_a_null_dp_shared_memory_the_node_cannot_hold_falls_back_to_private_copies(
    small_checkpoint: Path, shm_tmp: Path, tmp_path: Path
) -> None:
    """vLLM 0.33's veto: dp_shared_memory null resolves to true at DP 2, but where the shared tables cannot
    go (ENGRAM_SHM_DIR is not there) every replica keeps a private copy, with one warning; where they can,
    the replicas share them."""
    shared = values(run_local(2, workers.null_shared_tables, SMALL, str(small_checkpoint), timeout=240))
    assert [r["placement"] for r in shared] == ["shm", "shm"] and all(r["warnings"] == [] for r in shared)
    absent = tmp_path / "absent"
    env = {"ENGRAM_SHM_DIR": str(absent)}
    private = values(run_local(2, workers.null_shared_tables, SMALL, str(small_checkpoint), timeout=240, env=env))
    assert [r["placement"] for r in private] == ["host", "host"]
    assert all(
        r["warnings"]
        == [
            f"dp_shared_memory was null and resolved to true, but {absent} is not mounted; every replica keeps a "
            "private copy of the tables instead"
        ]
        for r in private
    )
