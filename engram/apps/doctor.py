"""Is this machine ready to serve Engram tables? Each check says pass, warn or fail, and how to fix it."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import torch

from engram.apps.planning import per_node, per_rank
from engram.config import dp_shared_memory_resolution
from engram.errors import EngramError
from engram.memory.host import read_host_limits
from engram.memory.registration import CudaRuntime
from engram.ops import cpu
from engram.runtime.placement.direct_reads import direct_reads_problem
from engram.runtime.placement.hugepages import thp_mode
from engram.runtime.placement.node_sharing import holders, listing
from engram.runtime.placement.numa import gpu_nodes
from engram.runtime.placement.rendezvous import rendezvous
from engram.runtime.placement.shm import node_identity, shared_capacity_error, shm_dir
from engram.runtime.plan import DeploymentPlan, plan_deployment
from engram.terminal import size_text

GIB = 1 << 30


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # pass, warn or fail
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def check_shm(plan: DeploymentPlan | None) -> Check:
    directory = shm_dir()
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() or directory.is_symlink() else "does not exist"
        return Check("shm", "fail", f"{directory} {what}", "mount a tmpfs there, or point ENGRAM_SHM_DIR at one")
    stats = os.statvfs(directory)
    total, free = stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize
    detail = f"{directory}: {size_text(total)} in all, {size_text(free)} free"
    if plan is None:
        return Check("shm", "pass", detail)
    fix = "docker run --shm-size=<size> or --ipc=host; or a larger ENGRAM_SHM_DIR"
    return _against_plan("shm", detail, _most_per_node(plan, "shm_bytes"), free, "needs", fix)


def check_dp_shared_memory(plan: DeploymentPlan, given: bool | None) -> Check:
    """Shared tables as the plan has them, and what would stop them on this node: vLLM 0.33's veto reasons
    (no shared memory file system, an Engram DP group of one replica per node, too little free space). A
    null that resolved to true falls back to private copies with a warning; an explicit true fails."""
    name = "dp_shared_memory"
    resolution = (dp_shared_memory_resolution(given, plan.config.dp_shared_memory) or "").removeprefix(f"{name}: ")
    if not plan.config.dp_shared_memory:
        detail = resolution or "false: every replica keeps its tables to itself"
        return Check(name, "pass", detail)
    if plan.sharing_note:
        return Check(name, "pass", f"{resolution}; but {plan.sharing_note}" if resolution else plan.sharing_note)
    local = plan.parallel.data_parallel_size_local or plan.parallel.data_parallel_size
    needed = _most_per_node(plan, "shm_bytes")
    reason = "Engram DP size 1: one replica per node, nobody to share with" if local == 1 else None
    reason = reason or shared_capacity_error(needed)
    if reason is None:
        return Check(
            name, "pass", resolution or f"true: one copy of {size_text(needed)} per node, shared by {local} replicas"
        )
    if given is None:
        detail = f"{resolution}; but here {reason}, so every replica would keep a private copy (a warning at start-up)"
        return Check(name, "warn", detail, "make room as the reason says, or co-locate replicas on a node")
    fix = "make room as the reason says, co-locate replicas on a node, or set dp_shared_memory to false"
    return Check(name, "fail", f"true, but here {reason}", fix)


def check_thp() -> Check:
    mode = thp_mode()
    if mode in ("always", "madvise"):
        return Check("transparent huge pages", "pass", f"mode {mode}: use_thp can back tables with huge pages")
    return Check(
        "transparent huge pages",
        "warn",
        f"mode {mode}: use_thp falls back to ordinary pages",
        "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled",
    )


def check_memlock() -> Check:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check("memlock limit", "pass", "unlimited")
    if os.geteuid() == 0:
        return Check("memlock limit", "pass", f"{size_text(soft)}, but root may pin more (CAP_IPC_LOCK)")
    return Check(
        "memlock limit",
        "warn",
        f"{size_text(soft)}: pinning host tables larger than this fails",
        "ulimit -l unlimited (docker: --ulimit memlock=-1)",
    )


def check_memory(plan: DeploymentPlan | None) -> Check:
    limits = read_host_limits()
    cgroup = (
        "no container memory limit"
        if limits.cgroup_bytes is None
        else f"container memory limit {size_text(limits.cgroup_bytes)}"
    )
    detail = f"RAM {size_text(limits.physical_bytes)}, {cgroup}"
    if plan is None:
        return Check("host memory", "pass", detail)
    fix = "--engram-config '{\"cpu_offload\": false}', dp_shared_memory or embedding_across_dp"
    return _against_plan("host memory", detail, _most_per_node(plan, "host_bytes"), limits.available, "pins", fix)


def _most_per_node(plan: DeploymentPlan, key: str) -> int:
    return max((node[key] for node in per_node(plan)), default=0)


def _against_plan(
    name: str, detail: str, needed: int, available: int, verb: str, fix: str, per: str = "per node"
) -> Check:
    """pass when the plan's largest node (or GPU) fits in what this machine has, else fail with the fix."""
    detail = f"{detail}; the plan {verb} {size_text(needed)} {per}"
    return Check(name, "pass", detail) if needed <= available else Check(name, "fail", detail, fix)


def check_node_copies(plan: DeploymentPlan | None, node_dir: str | None = None) -> Check:
    """The node copies (node_sharing) this user's processes hold on the node (meeting in `node_dir`, or in
    this network namespace), who loaded them and in which cgroup (its memory holds the pages it touched
    first), who maps them, and which copies the plan would hold."""
    try:
        copies = {c["digest"]: c for c in listing(node_dir)}
    except EngramError as exc:  # an unusable node_dir: said by its own check
        return Check("node copies", "warn", f"cannot look for them: {exc}", "fix node_dir first")
    held = [
        f"{c['describe']}, {size_text(int(c['size']))}, {_loader(int(c['loaded_by']))}, mapped by pids "
        + (", ".join(map(str, holders(str(digest)))) or "none of this pid namespace")
        for digest, c in sorted(copies.items(), key=lambda item: str(item[1]["describe"]))
    ]
    detail = f"{len(held)} held now: " + "; ".join(held) if held else "none held now by this user's processes"
    if plan is not None and plan.ranks[0].placement == "node":
        shards = max((node["node_copies"] for node in per_node(plan)), default=0)
        where = "the node"
        if plan.config.node_sharing == "numa":
            nodes = sorted({n for n in gpu_nodes() if n is not None})
            where = (
                f"each NUMA node holding GPUs ({', '.join(map(str, nodes))})"
                if len(nodes) > 1
                else "the node (one NUMA node with GPUs)"
            )
        detail += f"; the plan holds {shards} table shards, one copy each for {where}"
    return Check("node copies", "pass", detail)


def _loader(pid: int) -> str:
    """Who loaded a copy, and the cgroup its pages were charged to."""
    if pid <= 0:
        return "loaded in another pid namespace (its cgroup is not visible here)"
    return f"loaded by pid {pid} (cgroup {_cgroup(pid) or 'unknown'})"


def _cgroup(pid: int | str) -> str | None:
    """The cgroup (v2 path, or v1 memory controller's) of process `pid`."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    found = [line.split(":", 2) for line in lines if line.count(":") >= 2]
    memory = [path for _, controllers, path in found if "memory" in controllers.split(",")]  # cgroup v1
    unified = [path for _, controllers, path in found if controllers == ""]  # cgroup v2
    return next(iter(memory or unified), None)


def check_node() -> Check:
    try:
        ipc = os.readlink("/proc/self/ns/ipc")
    except OSError:
        ipc = "unknown"
    identity = node_identity(shm_dir()) if shm_dir().is_dir() else {"boot_id": "unknown"}
    return Check(
        "node identity",
        "pass",
        f"boot id {identity['boot_id']}, IPC namespace {ipc}: replicas that share tables must show the same values",
    )


NAMESPACES = ("net", "pid", "mnt", "ipc", "uts", "user", "time", "cgroup")


def check_namespaces(node_dir: str | None) -> Check:
    """The namespaces and cgroup this process runs in, and where node copies are found from here."""
    seen = []
    for kind in NAMESPACES:
        try:
            seen.append(f"{kind} {os.readlink(f'/proc/self/ns/{kind}').split(':', 1)[1].strip('[]')}")
        except OSError:
            seen.append(f"{kind} unknown")
    detail = ", ".join(seen) + f"; cgroup {_cgroup('self') or 'unknown'}"
    if node_dir is not None:
        return Check("namespaces", "pass", f"{detail}; node copies are found in {node_dir}, from any namespace")
    return Check(
        "namespaces",
        "pass",
        f"{detail}; node copies are found only by engines in this network namespace (each pod has its own: "
        "set node_dir to share across them)",
    )


def check_node_dir(node_dir: str | None) -> Check:
    """The rendezvous directory's state: usable (ours, no one else can write it), what it holds now."""
    if node_dir is None:
        return Check("node_dir", "pass", "not set: engines meet in their network namespace")
    try:
        held = rendezvous(node_dir).survey()
    except EngramError as exc:
        return Check("node_dir", "fail", str(exc), "a directory of this user that no other can write")
    return Check(
        "node_dir",
        "pass",
        f"{node_dir}: {held['servers']} engine(s) serving copies, {held['locks']} load(s) under way, "
        f"{held['digests']} row digest(s) kept; names left by killed engines removed",
    )


def check_cuda() -> list[Check]:
    if not torch.cuda.is_available():
        return [
            Check(
                "CUDA",
                "warn",
                "no CUDA device: the CPU reference backend only",
                "run on a GPU node with the NVIDIA driver and a CUDA build of torch",
            ),
            Check(
                "UVA",
                "warn",
                "no CUDA device: host tables cannot be read over UVA here",
                "UVA comes with CUDA: run on a GPU node",
            ),
        ]
    name = torch.cuda.get_device_name()
    return [
        Check("CUDA", "pass", f"{torch.cuda.device_count()} device(s), {name}, CUDA {torch.version.cuda}"),
        check_uva(),
    ]


UVA_FIX = "raise the memlock limit (ulimit -l unlimited; docker: --ulimit memlock=-1), update the NVIDIA driver, or keep the tables on the GPU (cpu_offload=false)"


def check_uva(runtime: CudaRuntime | None = None, device: str = "cuda") -> Check:
    """Really register a small host buffer and read it on the GPU through UVA (cuda.uva_probe)."""
    from engram.ops import cuda  # builds the CUDA kernels on first use

    try:
        return Check("UVA", "pass", cuda.uva_probe(runtime or cuda.LibraryRuntime(cuda.cuda_library()), device))
    except EngramError as exc:
        return Check("UVA", "fail", str(exc), UVA_FIX)


def check_nvcc() -> Check:
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        return Check(
            "nvcc",
            "warn",
            "not found: the CUDA kernels cannot be built",
            "install the CUDA toolkit, or put nvcc on PATH",
        )
    try:
        version = (
            subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=False)
            .stdout.strip()
            .splitlines()[-1]
        )
    except (OSError, subprocess.TimeoutExpired, IndexError):
        return Check("nvcc", "warn", f"{nvcc} does not run", "reinstall the CUDA toolkit")
    return Check("nvcc", "pass", f"{nvcc}: {version}")


def check_native() -> Check:
    if cpu.cpu_library() is None:
        return Check(
            "native CPU kernels",
            "warn",
            "not built: lookups and hashing use plain torch (slower)",
            cpu.unavailable_reason() or "",
        )
    return Check("native CPU kernels", "pass", "built (kernels/cpu, OpenMP)")


def check_direct_reads() -> Check:
    """Whether a RAM tier over file-backed tables can read its misses past the page cache here."""
    problem = direct_reads_problem()
    if problem is None:
        return Check("direct reads", "pass", "io_uring works: RAM tiers read their misses past the page cache")
    return Check(
        "direct reads",
        "warn",
        f"RAM tiers read their misses through the page cache here: {problem}",
        "allow io_uring (Linux 5.11 or newer; a container's seccomp profile, or kernel.io_uring_disabled, can forbid it)",
    )


def check_gpu_memory(plan: DeploymentPlan, total_bytes: int | None) -> Check:
    """The plan's largest per-rank device bytes (device tables, or the hot-row cache of host tables)
    against one GPU's memory; `total_bytes` None: no GPU here to check against."""
    needed = max((row["device_bytes"] for row in per_rank(plan)), default=0)
    detail = f"the plan puts {size_text(needed)} of tables or cache on each GPU"
    if total_bytes is None:
        return Check(
            "GPU memory",
            "warn" if needed else "pass",
            f"{detail}; no CUDA device here to check it against",
            "run engram doctor on the GPU node" if needed else "",
        )
    fix = "a smaller device_cache_bytes, cpu_offload=true, or more tensor parallelism"
    return _against_plan("GPU memory", f"{size_text(total_bytes)} per GPU", needed, total_bytes, "puts", fix, "per GPU")


def run_checks(
    plan: DeploymentPlan | None = None, given: bool | None = False, node_dir: str | None = None
) -> list[Check]:
    """`given`: the dp_shared_memory the user wrote (None: null, resolved by the plan); `node_dir`: the
    config's rendezvous directory."""
    gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    shared = [check_dp_shared_memory(plan, given)] if plan is not None else []
    if plan is not None and shared[0].status == "warn":  # a vetoed null: the replicas fall back to private copies
        private = msgspec.structs.replace(plan.config, dp_shared_memory=False)
        plan = plan_deployment(plan.spec, private, plan.parallel, plan.platform)
    return [
        *([check_gpu_memory(plan, gpu_bytes)] if plan is not None else []),
        *shared,
        check_shm(plan),
        check_thp(),
        check_memlock(),
        check_memory(plan),
        check_node(),
        check_namespaces(node_dir),
        check_node_dir(node_dir),
        check_node_copies(plan, node_dir),
        *check_cuda(),
        check_nvcc(),
        check_native(),
        check_direct_reads(),
    ]
