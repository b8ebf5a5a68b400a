"""The table layer: one table shard, opened once from its description and looked up by gather alone.

A shard is rows [row_start, row_start + rows) of a table of `table_rows` rows, stored in one of the row
formats (engram.ops.formats) where its placement says (placement/storage.py: a device tensor, an exact
host mapping pinned for UVA, huge pages, a node-shared memfd, or the checkpoint file's own pages). Its
bytes come from a checkpoint (engram.runtime.rank_tables.open_tables loads many at once), from the loader
callbacks an engine's own weight loading calls (`Table.weight_loader`: vLLM's, SGLang's), or, for a
file-backed shard, from nowhere at all: the rows are the file's pages.

`Table` checks the row range and the output once, and serves lookups through the reader of its mode
(engram.runtime.lookup: memory, a file's pages, a file through its RAM tier), chosen when it opens and
when it gets a tier (engram.runtime.tiers: keep_hot). engram's engine (EngramTables/EngramEmbedding) and
the engine plugins (engram.integrations) all serve their tables through it, opened as the config says by
engram.runtime.table_opener; with that module, this one is the plugins' door into the runtime: the names
they need are re-exported here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engram.errors import EngramError
from engram.memory.registration import CudaRuntime
from engram.ops.checks import check_id_dtype
from engram.ops.segments import Rows, as_parameter
from engram.runtime.checkpoints.loader import Checkpoint, shard_weight_loader, table_scale_loader
from engram.runtime.dist import Group, timeout_s
from engram.runtime.lookup import reader_for
from engram.runtime.placement.file_reads import watch_files
from engram.runtime.placement.filemap import file_shard
from engram.runtime.placement.node_copy import node_shard
from engram.runtime.placement.residency import DiskReads, ResidentBudget
from engram.runtime.placement.storage import allocate
from engram.runtime.shard import PACKED, Output, Part, Placement, ShardFormat, TableShard
from engram.runtime.tiers.assign import configured_profile
from engram.runtime.tiers.base import TierStats
from engram.runtime.tiers.budget import TierName
from engram.runtime.tiers.open import Tier, open_tier
from engram.runtime.tiers.profile import Profile, read_profile

__all__ = [
    "PACKED",
    "Checkpoint",
    "Group",
    "Output",
    "Part",
    "Placement",
    "Profile",
    "Rows",
    "ShardFormat",
    "Table",
    "TableStats",
    "Tier",
    "TierStats",
    "as_parameter",
    "configured_profile",
    "open_shard",
    "open_table",
    "read_profile",
    "shared_group",
]

log = logging.getLogger("engram")
# TierStats' counters, which a table sums over the tiers it has had (Table.tier_counters)
TIER_COUNTERS = (
    "lookups", "hits", "misses", "refreshes", "admissions", "evictions", "bytes_admitted", "bytes_hit", "bytes_missed",
)  # fmt: skip


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
    node_dir: str | None = None,
    device: torch.device | None = None,
    progress: bool = True,
) -> TableShard:
    """The storage of one shard, empty (zeros) unless file-backed or node-shared: placement file maps it
    from `checkpoint`, placement node attaches the node's copy or loads it from `checkpoint` (`sharing`:
    node_sharing's "node" or "numa", `node_dir` where the node's engines meet, `device` the GPU whose NUMA
    node decides), placement shm shares it
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
        name, fmt, row_start, rows, checkpoint, mode=sharing, device=where, runtime=runtime, progress=progress,
        node_dir=node_dir,
    )  # fmt: skip


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
        self.lookups = self.ids = self.readahead_bytes = 0
        self.reads = DiskReads(shard.readahead)  # what its lookups read from storage
        self.past_tiers: dict[str, int] = dict.fromkeys(TIER_COUNTERS, 0)  # the counters of tiers it no longer has
        self.tier = None

    @property
    def tier(self) -> Tier | None:
        """Its tier of hot rows, if it has one (keep_hot)."""
        return self._tier

    @tier.setter
    def tier(self, tier: Tier | None) -> None:
        """A new tier (or none) brings the reader of the mode it makes (engram.runtime.lookup); the tier
        it replaces has no read left in flight."""
        old = getattr(self, "_tier", None)
        if old is not None and old is not tier:
            old.drop()
            gone = old.stats()
            for key in TIER_COUNTERS:
                self.past_tiers[key] += getattr(gone, key)
        self._tier = tier
        self.reader = reader_for(self.shard, self.table_rows, tier, self.budget, self.reads)

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
        return self.reader.lookup(ids, out, kind, check)

    def prefetch(self, ids: torch.Tensor) -> int:
        """Start reading the pages of these rows of a file-backed table on disk, so that the lookup to come
        finds them in the page cache; the bytes asked for (0 where every probed page was resident, or the
        table is in memory)."""
        check_id_dtype(ids)
        asked = self.reader.prefetch(ids)
        self.readahead_bytes += asked
        return asked

    @property
    def refreshes(self) -> int:
        """Refreshes of every tier it has had (host counters: no device is waited for)."""
        return self.past_tiers["refreshes"] + (0 if self.tier is None else self.tier.refreshes)

    def tier_counters(self) -> dict[str, int]:
        """What every tier it has had did, summed (TierStats' counters: they only grow, whatever tier
        replaced which); reading the present tier's waits for the lookups queued so far on a GPU."""
        now = None if self.tier is None else self.tier.stats()
        return {key: value + (0 if now is None else getattr(now, key)) for key, value in self.past_tiers.items()}

    @property
    def disk_bytes_read(self) -> int:
        """What its lookups, prefetches and tier read from storage (a file-backed table on disk)."""
        return self.reads.bytes

    def keep_hot(
        self,
        budget_bytes: int,
        device: torch.device | str,
        name: TierName | None = None,
        *,
        policy: str = "online",
        hot: torch.Tensor | None = None,
        hot_counts: torch.Tensor | None = None,
        **tuning: int,
    ) -> int:
        """Keep this shard's hottest rows in a tier of `budget_bytes` in `device` memory (tiers.open.open_tier:
        `name` its kind, by default the one the shard calls for, a RamTier over a file on disk and a
        DeviceTier over memory; a tier of the other kind is refused, said once; `hot`, `hot_counts` a profile's warm start,
        `tuning` the device tier's window_ids and half_life); the rows it can hold. Call it once the rows are
        loaded: the table reads through its tier from its next lookup."""
        self.tier = open_tier(
            self.shard, budget_bytes, device, name, policy=policy, hot=hot, hot_counts=hot_counts,
            disk_reads=self.reads, **tuning,
        )  # fmt: skip
        return 0 if self.tier is None else self.tier.capacity

    def refresh(self) -> int:
        """Refresh the tier from the ids served since the last refresh (DeviceTier.refresh); the rows
        admitted. Call it between steps."""
        if self.tier is None:
            return 0
        with self.reads():
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
