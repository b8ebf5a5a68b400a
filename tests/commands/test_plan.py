"""`engram plan`: exact bytes for V4.1-Flash, collectives, validation, the plot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram.apps.presets import get_preset
from engram.cli import main

V41_TABLE = 202_758_032_400


def plan(capsys: pytest.CaptureFixture[str], *argv: str, preset: str = "deepseek-v4.1-flash") -> dict:  # type: ignore[type-arg]
    code = main(["plan", "--preset", preset, "--json", *argv])
    out = capsys.readouterr().out
    assert code == 0
    return json.loads(out)  # type: ignore[no-any-return]


def bytes_of_heads(heads: range) -> int:
    """Independent of the planner: rows of these heads in both layers, 264 bytes each."""
    primes = get_preset("deepseek-v4.1-flash").layout.primes.reshape(2, -1)
    return sum(int(primes[layer, h]) for layer in range(2) for h in heads) * 264


def test_v41_tp4_private(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan(capsys, "--tensor-parallel-size", "4")
    pinned = [r["pinned_host_bytes"] for r in report["per_rank"]]
    assert pinned == [50_688_955_152, 50_689_356_432, 50_689_705_968, 50_690_014_848]
    assert pinned == [bytes_of_heads(range(6 * r, 6 * r + 6)) for r in range(4)]
    assert sum(pinned) == V41_TABLE and all(r["device_bytes"] == r["shm_bytes"] == 0 for r in report["per_rank"])
    assert report["per_node"] == [
        {"node": 0, "host_bytes": V41_TABLE, "shm_bytes": 0, "device_bytes": 0, "page_cache_bytes": 0, "node_copies": 0}
    ]
    assert report["collectives"] == [
        {
            "op": "all_gather",
            "what": "rows along heads, every layer",
            "group": "TP ranks of a replica",
            "group_size": 4,
            "bytes_per_token": 2 * 24 * 256 * 2,
        }
    ]


def test_v41_tp8(capsys: pytest.CaptureFixture[str]) -> None:
    pinned = [r["pinned_host_bytes"] for r in plan(capsys, "--tensor-parallel-size", "8")["per_rank"]]
    assert pinned == [
        25_344_443_520,
        25_344_511_632,
        25_344_635_712,
        25_344_720_720,
        25_344_811_008,
        25_344_894_960,
        25_344_968_352,
        25_345_046_496,
    ]
    assert pinned == [bytes_of_heads(range(3 * r, 3 * r + 3)) for r in range(8)]
    assert sum(pinned) == V41_TABLE


def test_v41_vllm_layout_shards_heads_over_tp_x_edp(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.33 at TP 4 x DP 2 on one node, tables not shared: heads over TP x EDP = 8 ranks (shard =
    tp * 2 + dp), 3 of the 24 each, so rank 0 (tp 0, dp 0) holds heads 0-2 and rank 1 (tp 1) heads 6-8;
    the seed's layout gives each replica a TP-sharded copy, 6 heads a rank."""
    args = ("--tensor-parallel-size", "4", "--data-parallel-size", "2", "--engram-config.dp_shared_memory", "false")
    ours = plan(capsys, *args)
    pinned = [r["pinned_host_bytes"] for r in ours["per_rank"]]
    assert pinned[:2] == [bytes_of_heads(range(0, 3)), bytes_of_heads(range(6, 9))]
    assert pinned[4] == bytes_of_heads(range(3, 6))  # rank 4: tp 0, dp 1
    assert sum(pinned) == V41_TABLE and ours["vllm_refusal"] is None
    assert [(c["op"], c["group"], c["group_size"]) for c in ours["collectives"]] == [
        ("all_gather", "DP replicas at one TP rank", 2),
        ("all_gather", "TP x 2 DP ranks", 8),
    ]
    seed = plan(capsys, *args, "--engram-config.shard_layout", "replica")
    assert [r["pinned_host_bytes"] for r in seed["per_rank"]][:2] == [
        bytes_of_heads(range(0, 6)),
        bytes_of_heads(range(6, 12)),
    ]
    assert main(["plan", "--preset", "deepseek-v4.1-flash", *args]) == 0
    assert "shard layout: vllm (vLLM 0.33's per-rank layout)\n" in capsys.readouterr().out
    four = ("--data-parallel-size", "4", "--engram-config.dp_shared_memory", "false")
    assert main(["plan", "--preset", "deepseek-v4.1-flash", "--tensor-parallel-size", "4", *four]) == 0
    assert (
        "  vLLM 0.33 would refuse this deployment (Engram sharding leaves ranks without hash heads: 24 heads over "
        "16 shards); engram serves it with row shards\n"
    ) in capsys.readouterr().out


def test_v41_dp8_shared_against_private(capsys: pytest.CaptureFixture[str]) -> None:
    shared = plan(
        capsys, "--tensor-parallel-size", "4", "--data-parallel-size", "8", "--engram-config.dp_shared_memory", "true"
    )
    assert shared["per_node"] == [
        {
            "node": 0,
            "host_bytes": V41_TABLE,
            "shm_bytes": V41_TABLE,
            "device_bytes": 0,
            "page_cache_bytes": 0,
            "node_copies": 0,
        }
    ]
    assert [r["shm_bytes"] for r in shared["per_rank"][:4]] == [
        50_688_955_152,
        50_689_356_432,
        50_689_705_968,
        50_690_014_848,
    ]
    assert len(shared["per_rank"]) == 32 and all(r["pinned_host_bytes"] == 0 for r in shared["per_rank"])
    assert [c["group"] for c in shared["collectives"]] == ["TP ranks of a replica"]  # no DP collective
    replica = plan(
        capsys,
        *("--tensor-parallel-size", "4", "--data-parallel-size", "8", "--engram-config.dp_shared_memory", "false"),
        *("--engram-config.shard_layout", "replica"),
    )
    assert replica["per_node"] == [
        {
            "node": 0,
            "host_bytes": 8 * V41_TABLE,
            "shm_bytes": 0,
            "device_bytes": 0,
            "page_cache_bytes": 0,
            "node_copies": 0,
        }
    ]
    assert replica["shard_layout"].startswith("replica") and replica["vllm_refusal"] is None
    # vLLM 0.33's layout: one copy per node over TP 4 x EDP 8; 24 heads over 32 shards, which vLLM refuses
    private = plan(
        capsys, "--tensor-parallel-size", "4", "--data-parallel-size", "8", "--engram-config.dp_shared_memory", "false"
    )
    assert private["per_node"] == [
        {"node": 0, "host_bytes": V41_TABLE, "shm_bytes": 0, "device_bytes": 0, "page_cache_bytes": 0, "node_copies": 0}
    ]
    assert private["vllm_refusal"] == "Engram sharding leaves ranks without hash heads: 24 heads over 32 shards"
    across = plan(
        capsys,
        "--engram-config.shard_layout",
        "replica",
        "--tensor-parallel-size",
        "4",
        "--data-parallel-size",
        "8",
        "--data-parallel-size-local",
        "4",
        "--engram-config.embedding_across_dp",
        "true",
        "--engram-config.dp_shared_memory",
        "false",
    )
    # 32 ranks > 24 heads: row shards, shard = tp * 8 + dp; node 0 holds dp 0..3
    rows = get_preset("deepseek-v4.1-flash").layout.table_rows
    per = [-(-r // 32) for r in rows]
    node0 = sum(
        264 * (min((s + 1) * p, r) - min(s * p, r))
        for r, p in zip(rows, per, strict=True)
        for s in (t * 8 + d for t in range(4) for d in range(4))
    )
    assert [n["host_bytes"] for n in across["per_node"]] == [node0, V41_TABLE - node0]
    assert [(c["op"], c["group_size"], c["bytes_per_token"]) for c in across["collectives"]] == [
        ("all_gather", 8, 2 * 24 * 8),
        ("all_reduce", 32, 2 * 24 * 256 * 2),
    ]


def test_gpu_tables(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan(capsys, "--tensor-parallel-size", "4", "--engram-config", '{"cpu_offload": false}')
    assert [r["device_bytes"] for r in report["per_rank"]] == [
        50_688_955_152,
        50_689_356_432,
        50_689_705_968,
        50_690_014_848,
    ]
    assert report["per_node"][0]["host_bytes"] == 0


def test_invalid_deployment_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "demo", "--engram-config.dp_shared_memory", "true"]) == 2
    assert (
        capsys.readouterr().err
        == "error: /engram/dp_shared_memory: dp_shared_memory requires data_parallel_size > 1. [dp-shared-memory-needs-dp]\n"
    )


def test_text_and_plot(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs the plot extra (matplotlib)")
    target = tmp_path / "plan.png"
    assert (
        main(
            [
                "plan",
                "--preset",
                "deepseek-v4.1-flash",
                "--tensor-parallel-size",
                "4",
                "--data-parallel-size",
                "8",
                "--engram-config.dp_shared_memory",
                "true",
                "--plot",
                str(target),
                "--node-ram-gib",
                "2048",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "node 0: host 202,758,032,400 bytes (188.8 GiB), /dev/shm needed 202,758,032,400 bytes, GPU 0 bytes" in out
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and target.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["doctor", "--tensor-parallel-size", "0"],
            "error: /parallel/tensor_parallel_size: expected >= 1; got 0 [minimum]",
        ),
        (
            ["plan", "--preset", "demo", "--plot", "/nonexistent-engram-dir/plan.png"],
            "error: --plot /nonexistent-engram-dir/plan.png: the directory /nonexistent-engram-dir does not exist; create it or choose another",
        ),
        (
            ["plan", "--preset", "demo", "--tensor-parallel-size", "4096", "--data-parallel-size", "4096"],
            "error: TP 4096 x DP 4096 = 16,777,216 ranks is more than any deployment has (at most 131,072); check the parallel sizes",
        ),
    ],
)
def test_command_mistakes_are_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [message]


def test_plot_into_a_directory_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["plan", "--preset", "demo", "--plot", str(tmp_path)]) == 2
    assert (
        capsys.readouterr().err
        == f"error: --plot {tmp_path} is a directory; name a file, e.g. {tmp_path / 'plan.png'}\n"
    )
    assert list(tmp_path.iterdir()) == [] and not Path(f"{tmp_path}.png").exists()


def test_plans_grow_linearly_with_the_world() -> None:
    """TP 512 x DP 64: groups are ranges or one shared tuple, never a tuple per rank of the group."""
    import tracemalloc

    from engram.apps.presets import get_preset
    from engram.config import ParallelConfig, load_config
    from engram.runtime.plan import plan_deployment

    tracemalloc.start()
    plan = plan_deployment(
        get_preset("qwen4-exp-ple"),
        load_config({"embedding_across_dp": True, "dp_shared_memory": False}, env={}),
        ParallelConfig(tensor_parallel_size=512, data_parallel_size=64),
    )
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(plan.ranks) == 32_768 and len(plan.ranks[5].embedding_group) == 32_768
    assert plan.ranks[5].embedding_group is plan.ranks[77].embedding_group  # one tuple for all
    assert peak < 100 << 20  # a tuple per rank would take 32,768^2 x 8 bytes = 8 GiB


def test_the_device_cache_counts_in_device_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "--preset", "deepseek-v4.1-flash", "--tensor-parallel-size", "4", "--json"]
    assert main([*base, "--engram-config.device_cache_bytes", str(4 << 30)]) == 0
    ranks = json.loads(capsys.readouterr().out)["per_rank"]
    assert [r["device_bytes"] for r in ranks] == [4 << 30] * 4
    assert [r["pinned_host_bytes"] for r in ranks] == [50_688_955_152, 50_689_356_432, 50_689_705_968, 50_690_014_848]
    assert main([*base, "--engram-config.device_cache_bytes", str(1 << 40)]) == 0  # never more than the shard
    assert [r["device_bytes"] for r in json.loads(capsys.readouterr().out)["per_rank"]] == [
        r["pinned_host_bytes"] for r in ranks
    ]


def test_doctor_checks_the_gpu_bytes_against_the_gpu() -> None:
    from engram.apps.doctor import check_gpu_memory
    from engram.config import ParallelConfig, load_config
    from engram.runtime.plan import plan_deployment

    plan = plan_deployment(
        get_preset("deepseek-v4.1-flash"),
        load_config({"device_cache_bytes": 8 << 30}, env={}),
        ParallelConfig(tensor_parallel_size=4),
    )
    fits = check_gpu_memory(plan, 141 << 30)
    assert (fits.status, fits.detail) == ("pass", "141.0 GiB per GPU; the plan puts 8.0 GiB per GPU")
    tight = check_gpu_memory(plan, 4 << 30)
    assert tight.status == "fail" and "device_cache_bytes" in tight.fix
    unknown = check_gpu_memory(plan, None)
    assert unknown.status == "warn" and unknown.detail.endswith("no CUDA device here to check it against")


def test_v41_file_backed_counts_pages_once_per_node(capsys: pytest.CaptureFixture[str]) -> None:
    """TP 4 x DP 4 on two nodes: each node's page cache holds every TP shard once, whatever the process
    count, no rank pins or copies anything, and the copying placements' bytes are named beside it."""
    args = ("--tensor-parallel-size", "4", "--data-parallel-size", "4", "--data-parallel-size-local", "2")
    report = plan(capsys, "--engram-config.file_backed", "true", *args)
    assert report["placement"] == "file"
    assert all(r["pinned_host_bytes"] == r["shm_bytes"] == r["device_bytes"] == 0 for r in report["per_rank"])
    shard_bytes = [bytes_of_heads(range(6 * r, 6 * r + 6)) for r in range(4)]
    assert [r["file_bytes"] for r in report["per_rank"]] == shard_bytes * 4
    assert report["per_node"] == [
        {"node": n, "host_bytes": 0, "shm_bytes": 0, "device_bytes": 0, "page_cache_bytes": V41_TABLE, "node_copies": 0}
        for n in (0, 1)
    ]
    # unshared copies in vLLM 0.33's layout: one per node, heads split over TP x EDP (the node's 2 replicas)
    assert report["copying_instead"] == {"private": V41_TABLE, "dp_shared_memory": V41_TABLE}
    assert main(["plan", "--preset", "deepseek-v4.1-flash", "--engram-config.file_backed", "true", *args]) == 0
    assert "the copying placements would first read and write, per node: private 202,758,032,400 bytes" in (
        capsys.readouterr().out
    )


def test_v41_node_sharing_counts_one_copy_per_node_and_shard(capsys: pytest.CaptureFixture[str]) -> None:
    report = plan(
        capsys,
        *("--tensor-parallel-size", "4", "--data-parallel-size", "8", "--data-parallel-size-local", "4"),
        *("--engram-config.cpu_offload", "true", "--engram-config.node_sharing", "node"),
    )
    assert report["placement"] == "node" and report["sharing_note"] is None
    # each TP rank's shard (bytes as with dp_shared_memory) once per node: 2 tables x 4 TP shards
    assert [r["node_copy_bytes"] for r in report["per_rank"][:4]] == [
        50_688_955_152,
        50_689_356_432,
        50_689_705_968,
        50_690_014_848,
    ]
    assert report["per_node"] == [
        {"node": n, "host_bytes": V41_TABLE, "shm_bytes": 0, "device_bytes": 0, "page_cache_bytes": 0, "node_copies": 8}
        for n in (0, 1)
    ]
    main(
        ["plan", "--preset", "deepseek-v4.1-flash", "--engram-config", '{"cpu_offload": true, "node_sharing": "numa"}']
    )
    out = capsys.readouterr().out
    assert "node_sharing: 2 table shards in host memory, one copy each for each NUMA node holding GPUs" in out
    host = report["per_node"][0]["host_bytes"]
    assert (
        f"    memory charged: the cgroup (pod) whose engine loads a copy is charged its bytes, up to {host:,} bytes "
        f"({host / 2**30:.1f} GiB) for the pod that loads every shard (once it exits, its parent cgroup); a pod that "
        "attaches is charged nothing for them. Copies are shared by the engines of one network namespace (one pod: "
        "set node_dir to share across pods)\n"
    ) in out
    main(
        [
            "plan",
            "--preset",
            "deepseek-v4.1-flash",
            "--engram-config",
            '{"cpu_offload": true, "node_sharing": "node", "node_dir": "/run/engram"}',
        ]
    )
    out = capsys.readouterr().out
    assert "Copies are shared by every pod that mounts /run/engram\n" in out
    assert (
        f"    with `engram node-agent` on /run/engram: the agent's cgroup is charged all {V41_TABLE:,} bytes (give it "
        "that memory limit and more), every serving pod nothing\n"
    ) in out


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "lots"])
def test_a_node_ram_that_is_no_size_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str) -> None:
    plot = tmp_path / "p.png"
    with pytest.raises(SystemExit) as stopped:
        main(["plan", "--preset", "demo", "--node-ram-gib", value, "--plot", str(plot)])
    assert stopped.value.code == 2 and not plot.exists()
    why = "is not a number" if value == "lots" else "must be a finite number above 0"
    assert capsys.readouterr().err.splitlines()[-1] == f"engram plan: error: argument --node-ram-gib: {value!r} {why}"


@pytest.mark.parametrize(
    "config",
    [
        {"cpu_offload": True, "file_backed": True, "ram_cache_bytes": 1 << 30},
        {"cpu_offload": True, "file_backed": True, "file_cache_bytes": 4 << 30},
        {"cpu_offload": True, "node_sharing": "node"},
    ],
)
def test_a_valid_deployment_is_planned_with_its_alternatives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, object]
) -> None:
    """The plan's alternatives (tables copied into memory, shared or not) leave the settings that only
    the user's own placement has: a valid deployment is planned, never refused for them."""
    argv = [
        "plan",
        "--preset",
        "deepseek-v4.1-flash",
        "--engram-config",
        json.dumps(config),
        "--data-parallel-size",
        "2",
    ]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["engram"] == {**report["engram"], **config}
    if config.get("file_backed"):
        assert set(report["copying_instead"]) == {"private", "dp_shared_memory"}
    pytest.importorskip("matplotlib")
    assert main([*argv, "--plot", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0


def test_v41_inside_sglang_splits_rows_on_hash_columns_per_replica(capsys: pytest.CaptureFixture[str]) -> None:
    """--engine sglang: each DP replica holds a copy over its TP ranks, split on the layer's hash columns
    where their count divides TP (24 columns over 4 ranks: 6 heads each, as SGLang's shard_range puts
    them), else into equal row ranges (24 over 5: SGLang's floor split); one all-reduce of the rows a layer."""
    report = plan(capsys, "--tensor-parallel-size", "4", "--data-parallel-size", "2", "--engine", "sglang")
    pinned = [r["pinned_host_bytes"] for r in report["per_rank"]]
    assert pinned == [bytes_of_heads(range(6 * r, 6 * r + 6)) for r in range(4)] * 2
    assert report["per_node"][0]["host_bytes"] == 2 * V41_TABLE
    assert report["shard_layout"] == "sglang (SGLang 0.5.23's: each DP replica's copy split over its TP ranks)"
    assert report["collectives"] == [
        {
            "op": "all_reduce",
            "what": "rows, each row's owner giving it and the others zeros (SGLang's), every layer",
            "group": "TP ranks of a replica",
            "group_size": 4,
            "bytes_per_token": 2 * 24 * 256 * 2,
        }
    ]
    uneven = plan(capsys, "--tensor-parallel-size", "5", "--engine", "sglang")
    rows = get_preset("deepseek-v4.1-flash").layout.table_rows
    expected = [sum((n * (r + 1) // 5 - n * r // 5) for n in rows) * 264 for r in range(5)]
    assert [r["pinned_host_bytes"] for r in uneven["per_rank"]] == expected


@pytest.mark.parametrize(
    ("settings", "environment", "refused"),
    [
        (
            ["--engram-config.dp_shared_memory", "true", "--data-parallel-size", "2"],
            {},
            "engram setting 'dp_shared_memory' cannot be honoured inside SGLang",
        ),
        (
            ["--engram-config.embedding_across_dp", "true"],
            {},
            "engram setting 'embedding_across_dp' cannot be honoured inside SGLang",
        ),
        ([], {"SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS": "1"}, "SGLANG_OPT_DSV41_ENGRAM_PEER_SHARDS=1 asks SGLang to keep"),
    ],
)
def test_what_sglang_cannot_honour_is_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    settings: list[str],
    environment: dict[str, str],
    refused: str,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    for command in (["plan", "--preset", "tiny"], ["validate"]):
        argv = [*command, "--engram-config.cpu_offload", "true", *settings, "--engine", "sglang"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith(f"error: /engram: {refused}")
            and err.endswith(" [sglang-cannot-serve]\n")
            and err.count("\n") == 1
        )


def test_a_null_dp_shared_memory_stays_off_inside_sglang(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's rule turns a null dp_shared_memory on with cpu_offload and DP > 1; SGLang has no such rule."""
    assert (
        main(["validate", "--engram-config.cpu_offload", "true", "--data-parallel-size", "2", "--engine", "sglang"])
        == 0
    )
    out = capsys.readouterr().out
    assert " dp_shared_memory=false " in out and out.endswith(
        "engine: SGLang 0.5.23 (give the engram section in ENGRAM_SGLANG_CONFIG)\n"
    )


def test_the_planning_api_refuses_deepseek_with_disk_offload_as_the_cli_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from engram.config import ConfigError, ParallelConfig, load_config
    from engram.runtime.plan import plan_deployment

    config = load_config({"disk_offload": True}, env={})
    with pytest.raises(ConfigError) as refused:
        plan_deployment(get_preset("deepseek-v4.1-flash"), config, ParallelConfig(), "cuda")
    assert [(p.path, p.rule) for p in refused.value.errors] == [("/engram/disk_offload", "disk-offload-needs-qwen")]
    assert main(["plan", "--preset", "deepseek-v4.1-flash", "--engram-config.disk_offload", "true"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{refused.value.errors[0].message} [disk-offload-needs-qwen]")


def test_a_disk_offload_plan_says_what_each_rank_reads_and_keeps(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM 0.34's disk offload of Qwen4Exp's PLE tables at TP 2: no table in memory at any rank, the
    files' pages once per node, every rank's RAM tier its own, each token's full rows staged, no collective."""
    report = plan(
        capsys, "--engram-config", '{"disk_offload": true, "ram_cache_bytes": 1073741824}',
        "--tensor-parallel-size", "2", preset="qwen4-exp-ple",
    )  # fmt: skip
    spec = get_preset("qwen4-exp-ple")
    assert report["placement"] == "file" and report["collectives"] == []
    assert report["shard_layout"].startswith("vLLM 0.34's disk offload")
    assert [r["file_bytes"] for r in report["per_rank"]] == [spec.table_bytes] * 2  # the whole table each
    assert [r["ram_tier_bytes"] for r in report["per_rank"]] == [1 << 30] * 2
    assert report["per_node"] == [
        {
            "node": 0,
            "host_bytes": 2 << 30,
            "shm_bytes": 0,
            "device_bytes": 0,
            "page_cache_bytes": spec.table_bytes,
            "node_copies": 0,
        }
    ]
    layout = spec.layout
    assert report["staged_bytes_per_token"] == len(layout.layer_ids) * layout.columns * spec.head_dim * 2  # bf16 rows
    assert (
        main(
            ["plan", "--preset", "qwen4-exp-ple", "--engram-config.disk_offload", "true", "--tensor-parallel-size", "2"]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "vLLM 0.34's own path reads them one pread per row through the page cache" in text
    assert "dp_shared_memory: null" not in text  # no table to share
