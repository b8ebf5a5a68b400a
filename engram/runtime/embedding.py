"""EngramEmbedding: one layer's lookup, the module an engine calls every step.

forward(ids [T, C] global row ids, DEAD_ID = -1) -> [T, C, D] in the output dtype. The local gather reads
owned rows (zeros for DEAD_ID and rows of other shards); head shards then all-gather along heads, row
shards all-reduce the rows' bits as integers (exact: every row has one owner, the others add zero bits).
With embedding_across_dp the ids of all replicas are gathered first, padded with DEAD_ID to the largest
(idle replicas take part), and each replica keeps its own window of the combined rows. With
dp_shared_memory no DP collective runs at all."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from engram.errors import EngramError
from engram.ops import DEAD_ID
from engram.ops.segments import as_parameter
from engram.runtime.dist import Group
from engram.runtime.placement.residency import ResidentBudget
from engram.runtime.plan import TableShardPlan
from engram.runtime.shard import TableShard
from engram.runtime.table import Table


class EngramEmbedding(nn.Module):
    def __init__(
        self,
        table: Table | TableShard,
        plan: TableShardPlan,
        *,
        columns: int,
        group: Group | None = None,
        shard_order: Sequence[int] = (),
        dp_group: Group | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
        budget: ResidentBudget | None = None,
    ) -> None:
        """`table`: this rank's shard of the layer's table (a bare TableShard is opened as a Table with
        `out_dtype` and `budget`); `group`: the embedding group (None when it is this rank alone),
        `shard_order` its global ranks in shard order; `dp_group`: the replicas to gather ids over
        (embedding_across_dp only); `budget`: the rank's resident-set budget of its file-backed tables
        (file_cache_bytes), told of every lookup."""
        super().__init__()
        if isinstance(table, TableShard):
            table = Table(table, plan.table_rows, out_dtype=out_dtype, budget=budget)
        if plan.rows != table.rows or plan.row_start != table.row_start or plan.table_rows != table.table_rows:
            raise EngramError(
                f"{table.name}: the shard holds rows [{table.row_start}, {table.shard.row_stop}) of {table.table_rows}, the plan says [{plan.row_start}, {plan.row_stop}) of {plan.table_rows}"
            )
        self.table = table
        self.weight = nn.Parameter(as_parameter(table.weight), requires_grad=False)
        self.scale = nn.Parameter(as_parameter(table.scale), requires_grad=False) if table.scale is not None else None
        # fp8-table and nvfp4: one float32 in host memory, passed to the kernels by value (no device read)
        table_scale = table.table_scale
        self.table_scale = nn.Parameter(table_scale, requires_grad=False) if table_scale is not None else None
        self.plan = plan
        self.columns = columns
        self.dim = table.shard.format.dim
        self.group = group if group is not None and group.size > 1 else None
        self.dp_group = dp_group if dp_group is not None and dp_group.size > 1 else None
        self.out_dtype = table.out_dtype
        # all_gather returns members in ascending global rank; the combine wants shard order
        self.gather_order = [sorted(shard_order).index(r) for r in shard_order] if self.group is not None else [0]

    def forward(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """[T, C, D]; into `out` (contiguous, the output dtype) when given: a buffer kept across steps
        saves allocating and faulting in a fresh output every call."""
        if ids.dim() != 2 or ids.shape[1] != self.columns or ids.dtype not in (torch.int64, torch.int32):
            raise EngramError(f"ids must be int64 or int32 [tokens, {self.columns}], got {ids.dtype} {list(ids.shape)}")
        if out is not None and out.dtype != self.out_dtype:
            raise EngramError(f"out must be {self.out_dtype}, got {out.dtype}")
        ids = ids.to(torch.int64)
        if self.dp_group is None:
            return self.lookup_gathered(ids, out)
        everyone, start = gather_replica_ids(ids, self.dp_group)
        rows = self.lookup_gathered(everyone)[start : start + ids.shape[0]]
        return rows if out is None else out.copy_(rows)

    def lookup_gathered(self, ids: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Local gather and combine over the embedding group, for ids every member holds alike (this
        replica's, or with embedding_across_dp everyone's, as gather_replica_ids returns them)."""
        if self.group is None:
            return self.table.lookup(ids, out)
        # Every rank holds the same ids, and a head shard range-checks the other columns too (`check`), so
        # on the CPU every rank raises alike before the collective, and on a GPU every rank's kernels flag
        # the bad id alike (EngramTables.check_errors), with no sync.
        plan = self.plan
        if plan.kind == "head":
            rows = self._combine_heads(self.table.lookup(ids[:, plan.head_start : plan.head_stop], check=ids))
        else:
            rows = self._combine_rows(self.table.lookup(ids))
        return rows if out is None else out.copy_(rows)

    def _combine_heads(self, rows: torch.Tensor) -> torch.Tensor:
        group = self.group
        assert group is not None
        per = -(-self.columns // group.size)
        padded = rows.new_zeros((rows.shape[0], per, self.dim))
        padded[:, : rows.shape[1]] = rows
        parts = [torch.empty_like(padded) for _ in range(group.size)]
        dist.all_gather(parts, padded, group=group.handle)
        return torch.cat([parts[i] for i in self.gather_order], dim=1)[:, : self.columns]

    def _combine_rows(self, rows: torch.Tensor) -> torch.Tensor:
        group = self.group
        assert group is not None
        dist.all_reduce(as_integers(rows), group=group.handle)
        return rows


def as_integers(rows: torch.Tensor) -> torch.Tensor:
    """`rows` (contiguous) viewed as integers for the row shards' all-reduce: every element has one owner
    and the others hold zero bits, so an integer sum is that owner's bits exactly, where a float sum turns
    an owned -0.0 into +0.0 (0.0 + -0.0). int32 where the bytes allow it (gloo has no int16), else uint8."""
    flat = rows.view(-1).view(torch.uint8)
    return flat.view(torch.int32) if flat.numel() % 4 == 0 else flat


def gather_replica_ids(ids: torch.Tensor, group: Group) -> tuple[torch.Tensor, int]:
    """Every replica's ids [T_d, X], padded with DEAD_ID to the largest T (idle replicas send only
    padding), concatenated in replica order; and where this replica's window starts."""
    counts = [torch.zeros(1, dtype=torch.int64, device=ids.device) for _ in range(group.size)]
    dist.all_gather(counts, torch.tensor([ids.shape[0]], dtype=torch.int64, device=ids.device), group=group.handle)
    longest = max(int(c) for c in counts)
    padded = torch.full((longest, ids.shape[1]), DEAD_ID, dtype=torch.int64, device=ids.device)
    padded[: ids.shape[0]] = ids
    everyone = [torch.empty_like(padded) for _ in range(group.size)]
    dist.all_gather(everyone, padded, group=group.handle)
    return torch.cat(everyone), group.rank * longest
