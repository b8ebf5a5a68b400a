"""`engram plan`: validate a deployment, then print what it costs per rank, per node and per step,
without allocating anything."""

from __future__ import annotations

import argparse
import json
from typing import Any

import msgspec

from engram.apps.planning import host_bytes_by_dp, summary
from engram.apps.plotting import check_plot_path, figure
from engram.apps.presets import PRESETS, get_preset
from engram.commands import add_command, add_engine_arg, engine_config, positive_number
from engram.config import (
    add_deployment_args,
    add_engram_args,
    document_from_args,
    dp_shared_memory_resolution,
    validate_deployment,
)
from engram.memory.host import read_host_limits
from engram.runtime.plan import DeploymentPlan, plan_deployment

GIB = 1 << 30


def register(subparsers: Any) -> None:
    parser = add_command(subparsers, "plan")
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw host memory per node against DP size (needs matplotlib: pip install 'engram[plot]')",
    )
    parser.add_argument(
        "--node-ram-gib", type=positive_number, help="the node's RAM for the plot's line (default: this machine's)"
    )
    add_engram_args(parser)
    add_deployment_args(parser)
    add_engine_arg(parser)
    parser.set_defaults(run=run)


def build_plan(args: argparse.Namespace) -> tuple[DeploymentPlan, bool | None]:
    spec = get_preset(args.preset)
    document = {"model": msgspec.to_builtins(spec.model_config()), "parallel": {}, "platform": "cuda"}
    deployment = validate_deployment(document_from_args(args, document))
    assert deployment.parallel is not None and deployment.platform is not None
    config = engine_config(args.engine, deployment)
    plan = plan_deployment(spec, config, deployment.parallel, deployment.platform, args.engine)
    return plan, deployment.dp_shared_memory_given


def run(args: argparse.Namespace) -> int:
    plan, given = build_plan(args)
    report = summary(plan)
    if args.plot:
        draw(plan, args.plot, args.node_ram_gib)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    p = plan.parallel
    print(
        f"{plan.spec.name} on TP {p.tensor_parallel_size} x DP {p.data_parallel_size} ({p.data_parallel_size_local} per node), {plan.platform}, tables {report['placement']}: {report['table_bytes']:,} table bytes"
    )
    print(f"shard layout: {report['shard_layout']}")
    if plan.vllm_refusal:
        print(f"  vLLM 0.33 would refuse this deployment ({plan.vllm_refusal}); engram serves it with row shards")
    resolution = dp_shared_memory_resolution(given, plan.config.dp_shared_memory)
    if resolution and plan.engine == "vllm" and not plan.config.disk_offload:  # no table to share
        print(resolution)
    if plan.sharing_note:
        print(plan.sharing_note)
    print("per rank:           device bytes     pinned host bytes  shared (mapped) bytes")
    for row in report["per_rank"]:
        print(
            f"  rank {row['rank']:>3} (tp {row['tp_rank']}, dp {row['dp_rank']}, node {row['node']}): {row['device_bytes']:>16,} {row['pinned_host_bytes']:>20,} {row['shm_bytes'] + row['node_copy_bytes']:>20,}"
        )
    print("per node:")
    for node in report["per_node"]:
        print(
            f"  node {node['node']}: host {node['host_bytes']:,} bytes ({node['host_bytes'] / GIB:.1f} GiB), /dev/shm needed {node['shm_bytes']:,} bytes, GPU {node['device_bytes']:,} bytes"
        )
        if node["page_cache_bytes"] and plan.config.disk_offload:
            print(disk_offload_text(plan, node["page_cache_bytes"], report["staged_bytes_per_token"]))
        elif node["page_cache_bytes"]:
            print(
                f"    file-backed: {node['page_cache_bytes']:,} bytes of checkpoint pages, once for every process "
                "on the node, in the page cache (may exceed RAM); nothing is copied at start-up"
            )
        tiers = sum(r["ram_tier_bytes"] for r in report["per_rank"] if r["node"] == node["node"])
        if tiers:
            print(f"    RAM tiers: {tiers:,} bytes of the host bytes above, ram_cache_bytes in each process")
        if node["node_copies"]:
            where = "each NUMA node holding GPUs" if plan.config.node_sharing == "numa" else "the node"
            print(
                f"    node_sharing: {node['node_copies']} table shards in host memory, one copy each for {where}, "
                "loaded by the first engine process of this user that needs it and mapped by every other "
                "(of this deployment or another); `engram doctor` lists the copies a node holds and who maps them"
            )
            meet = (
                f"every pod that mounts {plan.config.node_dir}"
                if plan.config.node_dir
                else "the engines of one network namespace (one pod: set node_dir to share across pods)"
            )
            print(
                f"    memory charged: the cgroup (pod) whose engine loads a copy is charged its bytes, up to "
                f"{node['host_bytes']:,} bytes ({node['host_bytes'] / GIB:.1f} GiB) for the pod that loads every shard "
                "(once it exits, its parent cgroup); a pod that attaches is charged nothing for them. Copies are "
                f"shared by {meet}"
            )
            if plan.config.node_dir:
                print(
                    f"    with `engram node-agent` on {plan.config.node_dir}: the agent's cgroup is charged all "
                    f"{node['host_bytes']:,} bytes (give it that memory limit and more), every serving pod nothing"
                )
    if report["copying_instead"]:
        others = ", ".join(f"{name} {size:,} bytes" for name, size in report["copying_instead"].items())
        print(f"  the copying placements would first read and write, per node: {others}")
    print("per step:" + ("" if report["collectives"] else " no collectives"))
    for c in report["collectives"]:
        print(
            f"  {c['op']} of {c['what']} over {c['group']} ({c['group_size']} ranks): {c['bytes_per_token']:,} bytes per token"
        )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def disk_offload_text(plan: DeploymentPlan, page_bytes: int, staged: int) -> str:
    """What vLLM 0.34's disk offload does on a node, with vLLM's own path and with engram's."""
    bound = (
        f"each process keeping at most {plan.config.file_cache_bytes:,} bytes of them resident (file_cache_bytes)"
        if plan.config.file_cache_bytes
        else "as many as memory allows"
    )
    return (
        f"    disk_offload: no table in memory; the checkpoint's {page_bytes:,} bytes of table stay in its files, "
        f"and each step every rank reads its tokens' full rows ({staged:,} bytes per token: every layer, no ETP "
        "sharding) and copies them to its GPU. vLLM 0.34's own path reads them one pread per row through the page "
        f"cache; with an engram section, engram's file-backed table maps the files (the page cache's pages, {bound}) "
        f"and a RAM tier of {plan.config.ram_cache_bytes:,} bytes per rank keeps the hottest rows (ram_cache_bytes)"
    )


def draw(plan: DeploymentPlan, path: str, node_ram_gib: float | None) -> None:
    check_plot_path(path)  # before the sweep over DP sizes
    sizes = range(1, 17)
    series = host_bytes_by_dp(plan.spec, plan.config, plan.parallel.tensor_parallel_size, sizes)
    ram = node_ram_gib if node_ram_gib is not None else read_host_limits().physical_bytes / GIB
    styles = {"private": ("o", "-"), "embedding_across_dp": ("s", "--"), "dp_shared_memory": ("^", ":")}
    with figure(path) as axes:
        for name, values in series.items():
            marker, line = styles[name]
            axes.plot(list(sizes), [v / GIB for v in values], marker=marker, linestyle=line, label=name)
        axes.axhline(ram, color="black", linestyle="--", label=f"node RAM ({ram:,.0f} GiB)")
        axes.set_xlabel("data-parallel replicas on the node")
        axes.set_ylabel("host memory for Engram tables (GiB)")
        axes.set_title(f"{plan.spec.name}, TP {plan.parallel.tensor_parallel_size}: host memory per node")
        axes.set_yscale("log")
