"""Sharded lookups return exactly the rows safetensors' own reader gives (tests/runtime/reference.py), bit
for bit on checkpoints planted with negative zeros, for TP in {1, 2} x DP in {1, 2}, every valid config
(each placement of the CPU platform, both shard layouts), both families; two simulated nodes; processes
started by torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engram.apps.local_ranks import free_port, run_local, values
from engram.apps.presets import get_preset
from engram.config import ParallelConfig, load_config
from engram.errors import EngramError
from engram.runtime.checkpoints.writer import write_checkpoint
from engram.runtime.plan import head_range, plan_deployment, row_range, table_shards
from tests.runtime import sharding_workers
from tests.runtime.reference import plant_negative_zeros
from tests.runtime.specs import DS3, DS7, QWEN, SPECS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = {}
    for name, spec in SPECS.items():
        path = tmp_path_factory.mktemp(name)
        write_checkpoint(spec, path, seed=11)
        assert plant_negative_zeros(path, spec) > 0
        out[name] = str(path)
    return out


# -- plans (no processes) -------------------------------------------------------------------------


def test_v41_tp4_bytes_per_rank() -> None:
    plan = plan_deployment(
        get_preset("deepseek-v4.1-flash"), load_config(env={}), ParallelConfig(tensor_parallel_size=4)
    )
    assert [plan.shard_bytes(r) for r in plan.ranks] == [50_688_955_152, 50_689_356_432, 50_689_705_968, 50_690_014_848]
    assert all(t.kind == "head" for r in plan.ranks for t in r.tables)
    assert [(t.head_start, t.head_stop) for t in plan.ranks[1].tables] == [(6, 12), (6, 12)]


def test_uneven_heads_and_row_fallback() -> None:
    assert [head_range(i, 2, 7) for i in range(2)] == [(0, 4), (4, 7)]
    assert [head_range(i, 5, 7) for i in range(5)] == [(0, 2), (2, 4), (4, 6), (6, 7), (7, 7)]
    assert [row_range(i, 3, 10) for i in range(3)] == [(0, 4), (4, 8), (8, 10)]
    seven = table_shards(DS7, 1, 2)
    layout = DS7.layout
    assert seven[0].kind == "head" and (seven[0].row_start, seven[0].row_stop) == (
        int(layout.offsets[0, 0, 4]),
        layout.table_rows[0],
    )
    fallback = table_shards(DS3, 3, 4)  # 4 ranks, 3 heads
    assert fallback[0].kind == "row" and fallback[0].row_stop == DS3.layout.table_rows[0]
    qwen = table_shards(QWEN, 0, 2)
    assert qwen[0].kind == "row" and qwen[0].row_stop == QWEN.layout.table_rows[0] // 2


def test_groups_in_the_plan() -> None:
    across = plan_deployment(
        DS7,
        load_config({"embedding_across_dp": True, "dp_shared_memory": False, "shard_layout": "replica"}, env={}),
        ParallelConfig(tensor_parallel_size=2, data_parallel_size=2),
    )
    assert [(r.rank, r.tp_rank, r.dp_rank, r.shard_index) for r in across.ranks] == [
        (0, 0, 0, 0),
        (1, 1, 0, 2),
        (2, 0, 1, 1),
        (3, 1, 1, 3),
    ]
    assert tuple(across.ranks[0].embedding_group) == (0, 2, 1, 3)  # TP-major shard order
    assert tuple(across.ranks[1].dp_group) == (1, 3)
    shared = plan_deployment(
        DS7,
        load_config({"dp_shared_memory": True}, env={}),
        ParallelConfig(tensor_parallel_size=2, data_parallel_size=4, data_parallel_size_local=2),
    )
    assert [tuple(r.shm_group or ()) for r in shared.ranks] == [
        (0, 2),
        (1, 3),
        (0, 2),
        (1, 3),
        (4, 6),
        (5, 7),
        (4, 6),
        (5, 7),
    ]
    assert [r.node for r in shared.ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert tuple(shared.ranks[0].embedding_group) == (0, 1) and not shared.across_dp
    with pytest.raises(EngramError, match="data_parallel_size 4 is not a multiple of data_parallel_size_local 3"):
        plan_deployment(DS7, load_config(env={}), ParallelConfig(data_parallel_size=4, data_parallel_size_local=3))


def test_vllm_layout_groups() -> None:
    """vLLM 0.33's layout: DeepSeek heads over TP x EDP, EDP the gcd of DP and the replicas per node, TP-major
    (shard = tp * EDP + dp in block), whatever embedding_across_dp says for host tables; EDP = DP for GPU
    tables at TP 1 with embedding_across_dp. Qwen with embedding_across_dp: vLLM's ETP group, DP-major."""
    parallel = ParallelConfig(tensor_parallel_size=2, data_parallel_size=4, data_parallel_size_local=2)
    for across in (False, True):
        plan = plan_deployment(
            DS7, load_config({"embedding_across_dp": across, "dp_shared_memory": False}, env={}), parallel
        )
        assert [r.shard_index for r in plan.ranks] == [0, 2, 1, 3] * 2
        assert [tuple(r.embedding_group) for r in plan.ranks[::4]] == [(0, 2, 1, 3), (4, 6, 5, 7)]
        assert [tuple(r.dp_group) for r in plan.ranks[:2]] == [(0, 2), (1, 3)] and plan.across_dp
    gpu = load_config({"cpu_offload": False, "embedding_across_dp": True}, env={})
    plan = plan_deployment(DS7, gpu, ParallelConfig(data_parallel_size=4, data_parallel_size_local=2))
    assert tuple(plan.ranks[0].embedding_group) == (0, 1, 2, 3) and [r.shard_index for r in plan.ranks] == [0, 1, 2, 3]
    qwen = load_config({"embedding_across_dp": True, "dp_shared_memory": False}, env={})
    plan = plan_deployment(QWEN, qwen, ParallelConfig(tensor_parallel_size=2, data_parallel_size=2))
    assert [(r.tp_rank, r.dp_rank, r.shard_index) for r in plan.ranks] == [(0, 0, 0), (1, 0, 1), (0, 1, 2), (1, 1, 3)]
    assert tuple(plan.ranks[0].embedding_group) == (0, 1, 2, 3)  # ETP rank = dp * TP + tp
    rows = QWEN.layout.table_rows
    assert [(t.row_start, t.row_stop) for t in plan.ranks[2].tables] == [(r // 2, 3 * r // 4) for r in rows]
    seed = plan_deployment(DS7, load_config({"dp_shared_memory": False, "shard_layout": "replica"}, env={}), parallel)
    assert [tuple(r.embedding_group) for r in seed.ranks[::2]] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
    ] and not seed.across_dp


@pytest.mark.parametrize(
    "fields",
    [
        {"cpu_offload": True, "embedding_across_dp": True},  # dp_shared_memory null, resolved to true
        {"cpu_offload": True, "embedding_across_dp": True, "dp_shared_memory": True},
        {"file_backed": True, "embedding_across_dp": True, "dp_shared_memory": False},
    ],
)
def test_qwen_etp_group_is_get_parallel_size_whatever_sharing_says(fields: dict[str, bool]) -> None:
    """vLLM 0.33 sizes Qwen4Exp's ETP group by get_parallel_size (TP x DP with embedding_across_dp): at TP 2
    x DP 2 its rank 0 holds rows [0, 80,000,384) of the 320,001,536; ETP ranks go DP-major. Replicas that
    hold different rows share nothing, and the plan says so where sharing is on."""
    spec = get_preset("qwen4-exp-ple")
    config = load_config(fields, env={})
    parallel = ParallelConfig(tensor_parallel_size=2, data_parallel_size=2)
    plan = plan_deployment(spec, config, parallel, "cuda")
    assert config.get_parallel_size(parallel) == 4 and spec.layout.table_rows[0] == 320_001_536
    quarter = 80_000_384
    assert [(t.row_start, t.row_stop) for r in plan.ranks for t in r.tables[:1]] == [
        (i * quarter, (i + 1) * quarter) for i in range(4)
    ]
    assert all(tuple(r.embedding_group) == (0, 1, 2, 3) for r in plan.ranks) and plan.across_dp
    assert all(r.shm_group is None for r in plan.ranks)
    assert {r.placement for r in plan.ranks} == {"file" if fields.get("file_backed") else "pinned"}
    if plan.config.dp_shared_memory:
        assert plan.sharing_note == (
            "dp_shared_memory shares nothing here: Qwen4Exp's ETP group spreads one copy of the tables over the "
            "2 replicas (embedding_across_dp), so each holds rows of its own, privately"
        )
    else:
        assert plan.sharing_note is None


# -- real processes -------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "dp"), [(1, 1), (2, 1), (1, 2), (2, 2)])
def test_sharded_rows_equal_the_checkpoints(tp: int, dp: int, checkpoints: dict[str, str], shm_tmp: Path) -> None:
    names = ["ds7", "ds3", "qwen-small", *(["qwen-nvfp4"] if tp * dp == 4 else [])]
    reports = values(run_local(tp * dp, sharding_workers.check_all, tp, dp, dp, checkpoints, names, timeout=600))
    configs = len(sharding_workers.valid_configs(ParallelConfig(tensor_parallel_size=tp, data_parallel_size=dp)))
    # DP > 1: 10 in vLLM 0.33's layout, 8 unshared in the replica layout; DP 1: the 8 without sharing
    assert configs == (18 if dp > 1 else 8)
    for rank_reports in reports:
        assert len(rank_reports) == configs * len(names)
        for report in rank_reports:
            assert report["match"] is True, report
            assert report["steps"] == 3
            if report["shared"]:
                assert report["guard_works"] is True and report["placement"] == "shm"
    placements = {r["placement"] for r in reports[0]}
    assert placements == {"device", "host", "hugepages", "file", *(["shm"] if dp > 1 else [])}
    kinds = {(r["spec"], r["kind"]) for r in reports[0]}
    assert ("qwen-small", "row") in kinds and ("ds7", "head") in kinds
    if (tp, dp) == (1, 2):  # vLLM's GPU tables at TP 1 over DP: rows split over the replicas
        assert ("ds7", "row") in kinds
    if tp * dp == 4:
        assert ("ds3", "row") in kinds  # 4 ranks > 3 heads: row fallback under embedding_across_dp
    assert list(shm_tmp.iterdir()) == []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tp", "dp", "engram"),
    [(2, 1, {}), (1, 2, {"embedding_across_dp": True}), (2, 2, {"embedding_across_dp": True})],
)
def test_a_bad_id_raises_on_every_rank_alike(
    tp: int, dp: int, engram: dict[str, bool], checkpoints: dict[str, str], shm_tmp: Path
) -> None:
    """Head all-gathers (TP) and across-DP row exchanges follow the gather: every rank raises the same
    one line, nobody is left waiting in a collective, and the next step is right (prefetched too)."""
    reports = values(
        run_local(tp * dp, sharding_workers.bad_id_then_good, tp, dp, checkpoints["ds7"], engram, timeout=300)
    )
    rows = DS7.layout.table_rows[1]
    assert [r["error"] for r in reports] == [f"row id {rows} is outside the table's {rows} rows (DEAD_ID is -1)"] * (
        tp * dp
    )
    assert all(r["good_after"] and r["prefetch"] for r in reports)
    tokens = 5  # the first batch of rank 0
    shapes = [[tokens, 7], [tokens, 1, 7], [tokens, 3, 7], [tokens * 2 * 7]]
    assert reports[0]["shapes"] == [
        f"rows must be [tokens, 2, 7] (tokens, layers, columns); got {shape}" for shape in shapes
    ]


@pytest.mark.parametrize("dp", [1, 2])
def test_a_cpu_prefetch_starts_every_layers_reads_into_its_ram_tier(dp: int, checkpoints: dict[str, str]) -> None:
    """EngramTables.prefetch on the CPU with RAM tiers over the checkpoint's files: before any layer takes
    its rows, every layer's tier has admitted the rows of the step it lacked (their reads on their way),
    across replicas too (the gathered ids); the rows taken equal safetensors' reader's."""
    reports = values(run_local(dp, sharding_workers.prefetch_into_ram_tiers, dp, checkpoints["ds7"], timeout=300))
    for report in reports:
        assert report["tiers"] == ["RamTier", "RamTier"]
        assert all(step["rows"] for step in report["steps"])
        first = report["steps"][0]["admitted_before_take"]
        assert len(first) == 2 and all(n > 0 for n in first)


@pytest.mark.parametrize(
    ("nodes", "tp", "dp", "expected"),
    [
        (["a", "a", "b", "b"], 1, 4, 2),
        (["a"] * 4 + ["b"] * 4, 2, 4, 2),  # TP 2: ranks dp_rank * 2 + tp_rank
        (["a", "b", "a", "b"], 1, 4, None),  # replicas interleaved over the nodes
        (["a", "a", "a", "b"], 1, 4, None),  # unequal blocks
        (["a"] * 6, 1, 6, 6),
    ],
)
def test_replicas_per_node(nodes: list[str], tp: int, dp: int, expected: int | None) -> None:
    from engram.runtime.replica_nodes import replicas_per_node

    assert replicas_per_node(nodes, tp, dp) == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("nodes", "local", "placement", "groups"),
    [
        (["n0", "n0", "n1", "n1"], 4, "shm", [[0, 1], [0, 1], [2, 3], [2, 3]]),  # configured 4, the job has 2
        (["n0", "n1", "n0", "n1"], 2, "host", [[], [], [], []]),  # do not line up: private copies
    ],
)
def test_shared_tables_follow_the_real_nodes(
    nodes: list[str], local: int, placement: str, groups: list[list[int]], checkpoints: dict[str, str], shm_tmp: Path
) -> None:
    reports = values(run_local(4, sharding_workers.build_on_nodes, nodes, local, checkpoints["ds7"], timeout=300))
    assert [r["placement"] for r in reports] == [placement] * 4
    assert [r["shm_group"] for r in reports] == groups
    assert all(r["match"] for r in reports)


@pytest.mark.slow
def test_two_simulated_nodes(checkpoints: dict[str, str], shm_tmp: Path) -> None:
    reports = values(run_local(4, sharding_workers.check_all, 1, 4, 2, checkpoints, ["ds7"], timeout=600))
    for index, report in enumerate(reports[0]):
        per_rank = [r[index] for r in reports]
        assert all(r["match"] for r in per_rank), per_rank
        config = report["config"]
        if config["dp_shared_memory"]:
            paths = [r["shm_path"] for r in per_rank]
            assert paths[0] == paths[1] and paths[2] == paths[3] and paths[0] != paths[2]  # a copy per node
        if config["dp_shared_memory"]:
            continue
        if config["shard_layout"] == "replica":  # the seed's: TP x DP with embedding_across_dp, else a replica
            want = [[0, 1, 2, 3]] * 4 if config["embedding_across_dp"] else [[0], [1], [2], [3]]
        elif config["file_backed"]:  # the page cache holds one copy per node already: TP-only shards
            want = [[0], [1], [2], [3]]
        elif not config["cpu_offload"] and config["embedding_across_dp"]:  # GPU tables at TP 1: EDP = DP
            want = [[0, 1, 2, 3]] * 4
        else:  # vLLM's node-local Engram DP group: gcd(DP 4, 2 replicas per node)
            want = [[0, 1], [0, 1], [2, 3], [2, 3]]
        assert [r["group"] for r in per_rank] == want, config


@pytest.mark.slow
def test_torchrun(checkpoints: dict[str, str], tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(ROOT / "tests" / "runtime" / "torchrun_worker.py"),
        "--checkpoint", checkpoints["ds7"], "--out", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [(r["rank"], r["tp_rank"], r["dp_rank"]) for r in results] == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
    assert all(r["match"] and r["group"] == [0, 2, 1, 3] for r in results)


@pytest.mark.slow
def test_private_tables_that_do_not_fit_are_refused(checkpoints: dict[str, str]) -> None:
    assert values(run_local(2, sharding_workers.build_over_limit, checkpoints["ds7"], "vllm", timeout=300)) == [
        "built",
        "built",
    ]
    outcomes = run_local(2, sharding_workers.build_over_limit, checkpoints["ds7"], "replica", timeout=300)
    replica = load_config({"dp_shared_memory": False, "shard_layout": "replica"}, env={})
    need = plan_deployment(DS7, replica, ParallelConfig(data_parallel_size=2), "cpu").pinned_bytes_per_node()
    assert 2 * DS7.table_bytes <= need < 2 * DS7.table_bytes + 1024  # each shard's scales start 128-aligned
    for outcome in outcomes:
        assert outcome.error is not None and outcome.error.startswith(
            f"/engram/cpu_offload: Engram tables need {need:,} bytes"
        )
        assert "[host-memory]" in outcome.error
