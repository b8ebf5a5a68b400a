"""The table layer: one table shard, opened once from its description and looked up by gather alone.

A shard is rows [row_start, row_start + rows) of a table of `table_rows` rows, stored in one of the row
formats (engram.ops.formats) where its placement says (placement/storage.py: a device tensor, an exact
host mapping pinned for UVA, huge pages, a node-shared memfd, or the checkpoint file's own pages). Its
bytes come from a checkpoint (engram.runtime.tables.open_tables loads many at once), from the loader
callbacks an engine's own weight loading calls (`Table.weight_loader`: vLLM's), or, for a file-backed
shard, from nowhere at all: the rows are the file's pages.

`Table` owns everything a lookup reads through: a tier of hot rows that learns from the traffic
(engram.runtime.tier: device memory over a host table, device_cache_bytes; private RAM over a file-backed
one, ram_cache_bytes), the host-thread gather and one copy of a file the GPU cannot read over UVA, the read-ahead of a cold file's
rows and the resident-set budget over its page cache (file_cache_bytes). Its constructor checks the row
range and the output once; `lookup` builds one GatherCall and runs it. engram's engine
(EngramTables/EngramEmbedding) and the vLLM plugin (engram.integrations.vllm) both serve their tables
through it, and the plugin imports nothing of the runtime below this module."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from engram.errors import EngramError
from engram.memory.outputs import empty_cpu
from engram.memory.registration import CudaRuntime
from engram.ops import GatherCall, use_sorted
from engram.ops.checks import check_id_dtype, check_ids
from engram.ops.devices import ensure_kernels
from engram.ops.segments import Rows, as_parameter
from engram.runtime.checkpoints.loader import Checkpoint, shard_weight_loader, table_scale_loader
from engram.runtime.dist import Group, timeout_s
from engram.runtime.placement.filemap import (
    file_shard,
    in_files,
    private_scales,
    read_ahead,
    reading,
    rewritten,
    watch_files,
)
from engram.runtime.placement.node_copy import node_shard
from engram.runtime.placement.residency import ResidentBudget, storage_read_bytes
from engram.runtime.placement.storage import allocate, placement_for
from engram.runtime.rowindex import FREE
from engram.runtime.shard import Placement, ShardFormat, TableShard
from engram.runtime.tier import POLICIES, WINDOW_IDS, Tier, TierName, TierStats, capacity_for, tier_bytes
from engram.runtime.tiers.hot_rows import HotRows, Profile, cached_gather, read_profile

__all__ = [
    "PACKED",
    "Checkpoint",
    "Group",
    "Part",
    "Placement",
    "Profile",
    "ResidentBudget",
    "ShardFormat",
    "Table",
    "TableStats",
    "Tier",
    "TierStats",
    "as_parameter",
    "open_shard",
    "open_table",
    "placement_for",
    "read_profile",
    "shared_group",
    "uva_runtime",
]

log = logging.getLogger("engram")
# Distinct rows of a file on disk read (or taken from its tier) per batch: their pages (about 8 MiB) and
# rows fit beside a tier in a tight memory limit (bench_ram_tier: a prefill chunk asked for at once read
# 2.7x its pages).
READ_BATCH_ROWS = 2048
BATCHED_IDS = 1 << 16  # a lookup of more ids than this (a prefill chunk) reads in batches even without a tier
SCALES_SHARE = 4  # a RAM tier keeps its file's block scales in private memory when they take at most 1/4 of it

# The output kind of the stored bytes: each row's weight bytes, then its block scales' bytes (uint8).
PACKED: Literal["packed"] = "packed"
Output = torch.dtype | Literal["packed"]
Part = Literal["weight", "scale", "table_scale"]  # what a shard stores: rows, block scales, the table scale


def uva_runtime() -> CudaRuntime | None:
    """The CUDA runtime that pins host tables for the GPU's reads over UVA, or None without a GPU."""
    if not torch.cuda.is_available():
        return None
    from engram.ops.cuda import library_runtime

    return library_runtime()


def shared_group(handle: Any, ranks: Sequence[int], label: str) -> Group:
    """A torch.distributed CPU group (gloo) of the node's replicas that share placement shm's memory."""
    return Group(handle, tuple(ranks), label, timeout_s())


def open_shard(
    name: str,
    fmt: ShardFormat,
    placement: Placement,
    *,
    row_start: int = 0,
    table_rows: int | None = None,
    checkpoint: Checkpoint | None = None,
    group: Group | None = None,
    runtime: CudaRuntime | None = None,
    sharing: str = "node",
    device: torch.device | None = None,
    progress: bool = True,
) -> TableShard:
    """The storage of one shard, empty (zeros) unless file-backed or node-shared: placement file maps it
    from `checkpoint`, placement node attaches the node's copy or loads it from `checkpoint` (`sharing`:
    node_sharing's "node" or "numa", `device` the GPU whose NUMA node decides), placement shm shares it
    over `group` (the node-local replicas), and `runtime` pins host memory for the GPU."""
    rows = fmt.rows if table_rows is None else table_rows
    if row_start < 0 or row_start + fmt.rows > rows:
        raise EngramError(f"{name}: rows [{row_start:,}, {row_start + fmt.rows:,}) are not all in its {rows:,} rows")
    if placement not in ("file", "node"):
        return allocate(name, fmt, placement, row_start=row_start, group=group, runtime=runtime)
    if checkpoint is None:
        what = "a file-backed table" if placement == "file" else "a node-shared table (node_sharing)"
        raise EngramError(f"{name}: {what} needs the checkpoint it is served from")
    if placement == "file":
        return file_shard(name, fmt, row_start, rows, checkpoint, runtime)
    where = device or torch.device("cpu")
    return node_shard(
        name, fmt, row_start, rows, checkpoint, mode=sharing, device=where, runtime=runtime, progress=progress
    )


def open_table(
    name: str,
    fmt: ShardFormat,
    placement: Placement,
    *,
    out_dtype: torch.dtype = torch.bfloat16,
    budget: ResidentBudget | None = None,
    **storage: Any,
) -> Table:
    """open_shard (`storage` its keywords: row_start, table_rows, checkpoint, group, runtime), ready for
    lookups: its rows are filled by the loaders, Table.weight_loader (or are a file's pages)."""
    shard = open_shard(name, fmt, placement, **storage)
    table_rows = storage.get("table_rows") or fmt.rows
    return Table(shard, table_rows, out_dtype=out_dtype, budget=budget, group=storage.get("group"))


class Spread:
    """Rows gathered once per distinct id, written to every position of a lookup's ids that asked for
    them: `inverse` (torch.unique's) maps each position to its distinct id. Into `out` when given, else a
    new (recycled) output made on the first put, of the rows' width and dtype."""

    def __init__(self, inverse: torch.Tensor, distinct: int, out: torch.Tensor | None) -> None:
        self.order = torch.argsort(inverse, stable=True)  # positions, grouped by distinct id
        self.counts = torch.bincount(inverse, minlength=distinct)
        self.starts = self.counts.cumsum(0) - self.counts
        self.rows = None if out is None else out.view(inverse.numel(), -1)

    def put(self, at: torch.Tensor, got: torch.Tensor) -> None:
        """`got[i]` is the row of distinct id `at[i]`."""
        if self.rows is None:
            self.rows = empty_cpu((self.order.numel(), *got.shape[1:]), got.dtype)
        counts = self.counts[at]
        local = torch.repeat_interleave(torch.arange(at.numel()), counts)
        offsets = torch.arange(local.numel()) - torch.repeat_interleave(counts.cumsum(0) - counts, counts)
        self.rows[self.order[self.starts[at][local] + offsets]] = got[local]

    def result(self, shape: torch.Size, out: torch.Tensor | None) -> torch.Tensor:
        assert self.rows is not None
        return out if out is not None else self.rows.view(*shape, *self.rows.shape[1:])


@dataclass(frozen=True)
class TableStats:
    """What a table is and what its lookups did."""

    name: str
    placement: Placement
    row_start: int
    rows: int
    table_rows: int
    bytes: int  # of its storage (for a file-backed table: of the file's pages it views)
    lookups: int
    ids: int  # ids looked up, DEAD_ID and other shards' rows included
    readahead_bytes: int  # what prefetch asked the page cache for (file-backed tables on disk)
    disk_bytes_read: int  # what its lookups read from storage (file-backed tables on disk; /proc/self/io)
    tier: TierStats | None  # its tier of hot rows, if it has one
    origin: str  # "loaded" here, "attached" (a node copy another process loaded) or "file" (the checkpoint's pages)
    loaded_by: int | None  # a node copy's: the pid that loaded it
    note: str


class Table:
    """One table shard ready for lookups (module docstring)."""

    def __init__(
        self,
        shard: TableShard,
        table_rows: int,
        *,
        out_dtype: torch.dtype = torch.bfloat16,
        budget: ResidentBudget | None = None,
        group: Group | None = None,
    ) -> None:
        """`out_dtype`: what lookups return unless told otherwise; `budget`: the resident-set budget its
        files share with the other tables of the rank (file_cache_bytes); `group`: the replicas sharing
        its memory (placement shm), whose leader alone writes in the loaders."""
        if shard.row_start < 0 or shard.row_stop > table_rows:
            raise EngramError(
                f"{shard.name}: the shard holds rows [{shard.row_start:,}, {shard.row_stop:,}), outside its table's {table_rows:,}"
            )
        self.shard = shard
        self.table_rows = table_rows
        self.out_dtype = out_dtype
        self._check_output(out_dtype)
        self.group = group if shard.placement == "shm" else None
        self.budget = budget if shard.files else None
        if self.budget is not None:
            watch_files(self.budget, shard)
        # A file the GPU cannot read over UVA (not on tmpfs or hugetlbfs): host threads gather, one copy.
        self.staged = shard.placement in ("file", "node") and shard.device_pointer is None
        self.tier: Tier | None = None
        self.lookups = self.ids = self.readahead_bytes = self.disk_bytes_read = 0

    @property
    def name(self) -> str:
        return self.shard.name

    @property
    def row_start(self) -> int:
        return self.shard.row_start

    @property
    def rows(self) -> int:
        return self.shard.rows

    @property
    def weight(self) -> Rows:
        return self.shard.weight

    @property
    def scale(self) -> Rows | None:
        return self.shard.scale

    @property
    def table_scale(self) -> torch.Tensor | None:
        return self.shard.table_scale

    def cacheable(self, device: torch.device | str) -> bool:
        """Whether a cache in `device` memory can serve it: not a file a GPU reads through host threads."""
        return not (self.staged and torch.device(device).type == "cuda")

    def _check_output(self, kind: Output) -> None:
        """Raise unless lookups can return `kind`: the stored dtype (rows as stored), bf16 or fp32 (or
        the stored bytes, PACKED); any float dtype for rows stored as one."""
        stored = self.shard.format.row_format
        plain = stored.scale is None and not stored.table_scale
        if kind == PACKED or kind == stored.weight or kind in (torch.bfloat16, torch.float32):
            return
        if plain and kind in (torch.float16, torch.float32, torch.bfloat16):
            return
        raise EngramError(
            f"{self.name}: {self.shard.format.dtype} rows are looked up as {stored.weight} (as stored), bfloat16 or float32, not {kind}"
        )

    def lookup(
        self,
        ids: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        output: Output | None = None,
        check: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows for the global row ids `ids` (int64 or int32, any shape [..], on the CPU or a GPU): [.., dim]
        in `output` (default: out's dtype, else out_dtype; the stored dtype gives the rows as stored, with
        no scale applied), or with output=PACKED each row's stored bytes, weight then scales, uint8
        [.., row_bytes]. Into `out` when given. DEAD_ID and rows of other shards read zeros; an id outside
        the table raises on the CPU and is flagged on a GPU (GatherCall). `check`: the step's other ids,
        range-checked alike (a head shard's peers read them) and read ahead with these."""
        kind = output if output is not None else out.dtype if out is not None else self.out_dtype
        for asked in (ids, check):  # before the tier records them: every path below serves these ids
            if asked is not None:
                check_id_dtype(asked)
        self.lookups += 1
        self.ids += ids.numel()
        if self.tier is not None:
            if self.shard.files:
                self._forget_if_rewritten(self.tier)
            if self.tier.due and not (ids.is_cuda and torch.cuda.is_current_stream_capturing()):
                self.refresh()  # between this table's lookups of two steps
            self.tier.record(ids)
        if not self.shard.files:
            return self._lookup(ids, out, kind, check)
        if self.shard.readahead and not ids.is_cuda and check is None:
            if self.tier is not None and self.tier.eager:
                return self._read_through_tier(ids, out, kind)
            if ids.numel() > BATCHED_IDS:
                return self._read_in_batches(ids, out, kind)
        return self._read(ids, out, kind, check)

    def _forget_if_rewritten(self, tier: Tier) -> None:
        """A file behind the table rewritten in place since the tier copied rows from it (`cp new old`: same
        inode, same size) makes those rows stale: the tier lets them all go, and the traffic admits them
        again from the file as it now is. Noticed at the first lookup after the rewrite's last write."""
        changed = rewritten(self.shard)
        if changed:
            log.warning(
                "engram: %s changed while mapped: %s's tier lets its %d rows go and reads them again from the file",
                ", ".join(changed), self.name, tier.admission.used,
            )  # fmt: skip
            tier.forget()

    def _read(
        self,
        ids: torch.Tensor,
        out: torch.Tensor | None,
        kind: Output,
        check: torch.Tensor | None,
    ) -> torch.Tensor:
        """A lookup of a file-backed table: the pages of the rows to read (less the tier's) asked for at
        once, then gathered, and the rows missed admitted to the tier while their pages are in the page
        cache."""
        wanted = ids if check is None else check
        if self.tier is not None and not wanted.is_cuda:  # what the tier holds is not read from the file
            wanted = wanted.reshape(-1)[~self.tier.admission.hits(wanted)]
        with self._disk_reads(), reading(self.shard, wanted, self.budget):
            rows = self._lookup(ids, out, kind, check)
            if self.tier is not None:
                self.tier.admit(ids)
            return rows

    def _read_in_batches(self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output) -> torch.Tensor:
        """A lookup of a file on disk from host ids: each distinct row read once, READ_BATCH_ROWS at a time
        in address order (their pages asked for, then gathered), each batch's rows written straight to
        every id that asked for them. Batches, because a prefill chunk's pages can be more than the memory
        left for the page cache: asked for all at once, they push each other out before the gather reaches
        them, and are read twice."""
        distinct, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        spread = Spread(inverse, distinct.numel(), out)
        for start in range(0, distinct.numel(), READ_BATCH_ROWS):
            at = torch.arange(start, min(start + READ_BATCH_ROWS, distinct.numel()))
            with self._disk_reads(), reading(self.shard, distinct[at], self.budget):
                spread.put(at, self._gather(distinct[at], kind))
        return spread.result(ids.shape, out)

    def _read_through_tier(self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output) -> torch.Tensor:
        """A lookup of a file on disk from host ids through its RAM tier. The distinct rows it does not
        hold are admitted (Tier.admitting): read from the disk straight into their slots, all at once,
        where direct reads work, else READ_BATCH_ROWS at a time in address order through the page cache
        (as _read_in_batches), copied while their pages are resident. Every id's row is gathered from
        the tier while the first reads are on their way (the rows not held yet come out as zeros), and
        the rows admitted are then written to their ids. Its hits and the rows it admits are pinned until
        then (Tier.serving). A row it cannot admit (a static tier, or a lookup that pins every slot) is
        gathered from the file, READ_BATCH_ROWS at a time, and written straight to its ids (Spread)."""
        tier = self.tier
        assert tier is not None
        flat = ids.reshape(-1)
        if not flat.numel():
            return self._read(ids, out, kind, None)
        distinct, inverse = torch.unique(flat, return_inverse=True)
        distinct = distinct.to(torch.int64)  # int32 ids too: the tier's rows are int64
        check_ids(distinct[[0, -1]], self.table_rows)  # as the file's gather would: the tier's reads no id
        with tier.serving(distinct, inverse) as slot:
            misses = ((slot == FREE) & (distinct >= self.row_start) & (distinct < self.shard.row_stop)).nonzero()
            misses = misses.squeeze(1)  # others' rows and DEAD_ID keep FREE, a DEAD_ID slot: zeros
            if not misses.numel():
                return self._from_tier(slot[inverse].view(ids.shape), kind, out)
            rows, spread, admitted = None, None, torch.zeros(distinct.numel(), dtype=torch.bool)
            batch = misses.numel() if tier.direct else READ_BATCH_ROWS  # direct reads leave no page to push out
            for start in range(0, misses.numel(), batch):
                at = misses[start : start + batch]
                asking = (
                    contextlib.nullcontext()
                    if tier.direct
                    else reading(self.shard, distinct[at], self.budget, behind=True)
                )
                with self._disk_reads(), asking, tier.admitting(distinct[at]) as got:
                    if rows is None:  # the CPU's share of the lookup, while the disk reads the first batch
                        rows = self._from_tier(slot[inverse].view(ids.shape), kind, out)
                slot[at[: got.numel()]] = got
                admitted[at[: got.numel()]] = True
                left = at[got.numel() :]
                for first in range(0, left.numel(), READ_BATCH_ROWS):  # pages that fit the page cache at once
                    part = left[first : first + READ_BATCH_ROWS]
                    spread = spread or Spread(inverse, distinct.numel(), rows)
                    with self._disk_reads(), reading(self.shard, distinct[part], self.budget):
                        spread.put(part, self._gather(distinct[part], kind))
            assert rows is not None
            late = admitted[inverse].nonzero().squeeze(1)  # the ids whose rows this lookup admitted
            for start in range(0, late.numel(), READ_BATCH_ROWS):  # a few MB of transient rows at a time
                at = late[start : start + READ_BATCH_ROWS]
                rows.view(flat.numel(), -1)[at] = self._gather(slot[inverse[at]], kind, from_tier=True)
        return rows

    def _from_tier(self, slots: torch.Tensor, kind: Output, out: torch.Tensor | None) -> torch.Tensor:
        """The tier's rows in `slots` (FREE: zeros), into `out` when given."""
        rows = self._gather(slots, kind, from_tier=True)
        return rows if out is None else out.copy_(rows)

    def _gather(self, ids: torch.Tensor, kind: Output, *, from_tier: bool = False) -> torch.Tensor:
        """Rows of `ids` in `kind` read from the table alone, or (`from_tier`) the tier's rows in slots `ids`."""
        parts = []
        for call in self._calls(ids, kind, None):
            if from_tier:
                assert self.tier is not None
                hot = self._hot(self.tier.rows, call)
                call = GatherCall(
                    hot.weight, hot.scale, ids, 0, hot.weight.shape[0], call.out_dtype, table_scale=call.table_scale
                )
            parts.append(call.run())
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    @contextlib.contextmanager
    def _disk_reads(self) -> Iterator[None]:
        """Count what the reads inside bring in from storage (a file-backed table on disk; a rank's
        lookups run one at a time, so its process's count is theirs)."""
        before = storage_read_bytes() if self.shard.readahead else 0
        try:
            yield
        finally:
            if self.shard.readahead:
                self.disk_bytes_read += storage_read_bytes() - before

    def prefetch(self, ids: torch.Tensor) -> int:
        """Start reading the pages of these rows of a file-backed table on disk, so that the lookup to come
        finds them in the page cache; the bytes asked for (0 where every probed page was resident, or the
        table is in memory)."""
        check_id_dtype(ids)
        if not self.shard.readahead:
            return 0
        with self._disk_reads():
            asked = read_ahead(self.shard, ids)
        self.readahead_bytes += 0 if asked is None else asked.bytes
        return 0 if asked is None else asked.bytes

    def _lookup(
        self, ids: torch.Tensor, out: torch.Tensor | None, kind: Output, check: torch.Tensor | None
    ) -> torch.Tensor:
        ensure_kernels(ids.device)
        if self.staged and ids.is_cuda:  # host threads read the file's pages; one copy to the GPU
            host = self._rows(ids.cpu(), kind, None if check is None else check.cpu())
            rows = host.pin_memory().to(ids.device, non_blocking=True)
            return rows if out is None else out.copy_(rows)
        if out is not None and self.tier is None and kind != PACKED:
            return self._call(ids, out, check).run()
        rows = self._rows(ids, kind, check)
        return rows if out is None else out.copy_(rows)

    def _rows(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> torch.Tensor:
        parts = [
            call.run() if self.tier is None else self._cached(call, counted=not i)  # a packed lookup counts once
            for i, call in enumerate(self._calls(ids, kind, check))
        ]
        return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]

    def _calls(self, ids: torch.Tensor, kind: Output, check: torch.Tensor | None) -> list[GatherCall]:
        """The gathers of `ids` in `kind` from the table: one, or for PACKED one per stored part (the
        weight's bytes, then the scales')."""
        if kind != PACKED:
            return [self._call(ids, kind, check)]
        sort = self._sorted(ids)
        return [
            GatherCall(part.view(torch.uint8), None, ids, self.row_start, self.table_rows, torch.uint8, sort, check)
            for part in (self.shard.weight, self.shard.scale)
            if part is not None
        ]

    def _call(self, ids: torch.Tensor, out: torch.Tensor | torch.dtype, check: torch.Tensor | None) -> GatherCall:
        shard = self.shard
        dtype = out.dtype if isinstance(out, torch.Tensor) else out
        if dtype == shard.weight.dtype:  # as stored: no scale applied (Qwen4Exp's fp8 rows, say)
            return GatherCall(shard.weight, None, ids, shard.row_start, self.table_rows, out, self._sorted(ids), check)
        table_scale = None if shard.table_scale is None else float(shard.table_scale[0])  # a loader may set it late
        return GatherCall(
            shard.weight, shard.scale, ids, shard.row_start, self.table_rows, out, self._sorted(ids), check, table_scale
        )

    def _sorted(self, ids: torch.Tensor) -> bool:
        return use_sorted(ids.numel(), self.shard.weight, ids.device)

    def _cached(self, call: GatherCall, *, counted: bool) -> torch.Tensor:
        """`call` with the tier's hits read from it; `counted`: its ids are added to the tier's counters
        (a packed lookup gathers twice, and counts once)."""
        tier = self.tier
        assert tier is not None
        counts = tier.counts if counted else None
        return cached_gather(self._hot(tier.rows, call), call, counts, (self.shard.row_start, self.shard.row_stop))

    def _hot(self, cache: HotRows, call: GatherCall) -> HotRows:
        """The tier's rows in the form `call` reads the table's: as stored, raw bytes, or with scales."""
        if call.weight is self.shard.weight:
            return cache if call.scale is not None else cache.view(cache.weight, None)
        stored = cache.weight if call.weight.data_ptr() == self.shard.weight.data_ptr() else cache.scale
        assert stored is not None
        return cache.view(stored.view(torch.uint8), None)

    def keep_hot(
        self,
        budget_bytes: int,
        device: torch.device | str,
        name: TierName = "device",
        *,
        policy: str = "online",
        hot: torch.Tensor | None = None,
        hot_counts: torch.Tensor | None = None,
        **tuning: int,
    ) -> int:
        """Keep this shard's hottest rows in `device` memory (a tier: the "device" one over a host table,
        the "ram" one over a file-backed table), as many as `budget_bytes` hold with the tier's own ids,
        ring and sketch (capacity_for), and for a RAM tier the block scales it may keep (_scales_kept);
        the rows it can hold.
        `hot`: a profile's rows (most frequent first), its warm start, and `hot_counts` their counts (the
        estimate's start: Admission.warm); with policy "static" the only rows it holds. `tuning`: Tier's window_ids and half_life. Call it once the rows are loaded."""
        if not self.cacheable(device):
            log.warning(
                "engram: device_cache_bytes is not used for %s: its file is gathered on host threads (put the "
                "checkpoint on tmpfs to read it over UVA and cache it)",
                self.name,
            )
            return 0
        if policy not in POLICIES:
            raise EngramError(f"{self.name}: a tier's policy is one of {', '.join(POLICIES)}, not {policy!r}")
        if policy == "static" and hot is None:
            raise EngramError(f"{self.name}: a static tier keeps a profile's rows; give it one (engram profile --out)")
        window = tuning.get("window_ids", WINDOW_IDS)
        scales = self._scales_kept(budget_bytes)
        capacity = capacity_for(
            budget_bytes - scales,
            self.shard.format.row_bytes,
            self.shard.rows,
            window,
            policy,
            eager=self.shard.readahead,
        )
        if capacity == 0:
            self.tier = None
            if budget_bytes > 0 and self.shard.rows:
                need = scales + tier_bytes(1, self.shard.format.row_bytes, self.shard.rows, window, policy, self.shard.readahead)  # fmt: skip
                log.warning(
                    "engram: %s gets no %s tier of hot rows: its %s bytes hold no row once the tier's own state is "
                    "paid; give its tier at least %s bytes (the rank's budget is split over its tables), or 0 for none",
                    self.name, name, f"{budget_bytes:,}", f"{need:,}",
                )  # fmt: skip
            return 0
        if scales:
            with self._disk_reads():
                private_scales(self.shard)
        tier = Tier(self.shard, capacity, device, name, policy=policy, scale_bytes=scales, **tuning)
        if hot is not None:
            with self._disk_reads():
                held = tier.warm(hot, hot_counts)
            if held == 0 and policy == "static":
                return 0  # the profile has none of this shard's rows
        self.tier = tier
        return capacity

    def _scales_kept(self, budget_bytes: int) -> int:
        """The bytes of a RAM tier's budget its shard's block scales take in private memory
        (private_scales): kept there when they take at most 1/SCALES_SHARE of it, so that most of it
        holds rows, or when they already are."""
        scale = self.shard.scale
        if not self.shard.readahead or scale is None:
            return 0
        size = scale.numel() * scale.element_size()
        return 0 if in_files(self.shard, scale) and size * SCALES_SHARE > budget_bytes else size

    def refresh(self) -> int:
        """Refresh the tier from the ids served since the last refresh (Tier.refresh); the rows admitted.
        Call it between steps."""
        if self.tier is None:
            return 0
        with self._disk_reads():
            return self.tier.refresh()

    def weight_loader(self, part: Part) -> Callable[..., None]:
        """The loader of one part of the shard, `(param, loaded, checkpoint_start=0)` as vLLM calls its
        loaders: `loaded` holds the table's rows from `checkpoint_start` on, and the rows it shares with
        the shard are copied into `param` (a view of this shard's part); the table scale is one float32.
        With placement shm the group's leader alone copies and every member meets at a barrier after each
        call; a file-backed shard copies nothing (its rows are the file's pages) and checks the shapes."""
        f = self.shard.format.row_format
        suffix = {"weight": "weight", "scale": f.scale_name, "table_scale": f.table_scale_name}[part]
        tensor = f"{self.name}.{suffix}"
        if part == "table_scale":
            return table_scale_loader(self.shard, tensor, self.group)
        return shard_weight_loader(self.shard, tensor, self.group)

    def stats(self) -> TableStats:
        """What the table is and what its lookups did (reading the device cache's counters waits for the
        lookups queued so far on a GPU)."""
        shard = self.shard
        return TableStats(
            shard.name, shard.placement, shard.row_start, shard.rows, self.table_rows, shard.format.nbytes,
            self.lookups, self.ids, self.readahead_bytes, self.disk_bytes_read,
            None if self.tier is None else self.tier.stats(),
            "file" if shard.files else "attached" if shard.attached else "loaded", shard.loaded_by, shard.note,
        )  # fmt: skip

    def release(self) -> bool:
        """Free the shard's memory now (TableShard.release) and its tier."""
        self.tier = None
        return self.shard.release()
