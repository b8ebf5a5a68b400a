"""What both tiers are made of: the slots of the rows a tier holds (in `device` memory), filled by copying
an admission's rows from the shard; the counters its lookups and admissions add to; a warm start from a
profile; and its stats. DeviceTier and RamTier add how they choose (windowed.py, clock.py) and when."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engram.ops.segments import Rows
from engram.runtime.placement.file_changes import being_written, files_named_on_fault, rewritten
from engram.runtime.placement.file_reads import read_ahead, scales_from
from engram.runtime.shard import TableShard
from engram.runtime.tiers.budget import Policy, TierName
from engram.runtime.tiers.choice import Change
from engram.runtime.tiers.clock import ClockAdmission
from engram.runtime.tiers.hot_rows import COUNTS, HotRows, stored_rows
from engram.runtime.tiers.windowed import WindowedAdmission

CANDIDATE_CHUNK = 8192  # admitted rows copied at a time: a few MB of transients
log = logging.getLogger("engram")


@dataclass(frozen=True)
class TierStats:
    """What a tier holds and what its lookups and refreshes did. Hits + misses = lookups (ids looked up
    while it served, DEAD_ID and other shards' ids among the misses); bytes count rows as stored."""

    tier: TierName
    policy: Policy
    capacity_rows: int
    rows: int  # held now
    bytes: int  # its memory: the rows' slots, their ids and slots, the sketch, the block scales it keeps
    lookups: int
    hits: int
    misses: int
    refreshes: int
    admissions: int
    evictions: int
    bytes_admitted: int  # copied into the tier from the table
    bytes_hit: int  # read from the tier
    bytes_missed: int  # read from the table below it, for misses of rows the shard owns


class TierBase:
    """Hot rows of one shard in `device` memory, chosen by `admission` (module docstring)."""

    rows: HotRows  # the tier's rows as lookups read them (hot_rows.cached_gather): each tier links them to its choice
    direct = False  # whether its misses are read from the disk past the page cache (a RamTier, where that works)

    def __init__(
        self,
        shard: TableShard,
        admission: WindowedAdmission | ClockAdmission,
        device: torch.device | str,
        name: TierName,
        *,
        scale_bytes: int = 0,
    ) -> None:
        """`scale_bytes`: the shard's block scales kept in private memory for it, counted in its bytes."""
        self.shard, self.admission, self.name, self.device = shard, admission, name, torch.device(device)
        self.scale_bytes = scale_bytes
        capacity = admission.capacity
        self.weight = torch.zeros(capacity, *shard.weight.shape[1:], dtype=shard.weight.dtype, device=device)
        self.scale = None
        if shard.scale is not None:
            self.scale = torch.zeros(capacity, *shard.scale.shape[1:], dtype=shard.scale.dtype, device=device)
        self.counts = torch.zeros(COUNTS, dtype=torch.int64, device=device)
        self.refreshes = self.admissions = self.evictions = 0
        self.written: list[str] = []  # the shard's files a process had open for writing at the last lookup

    @property
    def capacity(self) -> int:
        return self.admission.capacity

    @property
    def policy(self) -> Policy:
        return self.admission.policy

    @property
    def own_bytes(self) -> int:
        """Bytes of its state besides the admission's and the rows' (a device tier's window of ids)."""
        return 0

    @property
    def due(self) -> bool:
        """Whether it has a refresh to make before the next lookup (a DeviceTier once a window was served)."""
        return False

    @property
    def windowed(self) -> bool:
        """Whether it chooses between steps, from a window of ids (DeviceTier), not at every lookup."""
        return False

    def sees(self, ids: torch.Tensor) -> None:
        """A lookup of `ids` is about to be served (DeviceTier keeps them for its next refresh)."""

    def refresh(self) -> int:
        """Between steps: the rows admitted (a tier that chooses at every lookup has nothing to do)."""
        return 0

    def admit(self, ids: torch.Tensor) -> int:
        """After a lookup of `ids`, while the pages it read are resident: the rows admitted (a tier that
        chooses between steps admits nothing here)."""
        return 0

    def settle(self) -> None:
        """Wait for rows a prefetch is reading into it (a RamTier's), before anything else touches them."""

    def drop(self) -> None:
        """It is going away: wait for any read still writing its slots."""

    def warm(self, hot: torch.Tensor, counts: torch.Tensor | None = None) -> int:
        """Start from a profile's hot rows (most frequent first) and their counts; the rows held."""
        self._move(self.admission.warm(hot, counts), cold=True)
        return self.admission.used

    def forget(self) -> None:
        """Let every row go (their bytes are no longer the table's): the traffic admits them again."""
        self.admission.warm(torch.empty(0, dtype=torch.int64))

    def follow_files(self) -> None:
        """Before a lookup of a file-backed shard through the tier: a file behind it rewritten in place
        since the tier copied rows from it (`cp new old`: same inode, same size) makes those rows stale.
        The tier lets them all go, its private block scales are read again, and the traffic admits rows
        again from the file as it now is; noticed at the first lookup after the rewrite's last write. A
        process that has the file open for writing (being_written, any namespace) may change rows through
        a mapping without changing any time: while one does, the tier lets its rows go before every lookup
        (each lookup's rows are read during it) and block scales are read from the file, until it is gone."""
        shard = self.shard
        changed, writing = rewritten(shard), being_written(shard) or []
        if writing and writing != self.written:
            log.warning(
                "engram: %s is open for writing by another process: %s's tier keeps no row from one lookup to "
                "the next while it is (each lookup reads its rows from the file)",
                ", ".join(writing), shard.name,
            )  # fmt: skip
        elif changed:
            log.warning(
                "engram: %s changed while mapped: %s's tier lets its %d rows go and reads them again from the file",
                ", ".join(changed), shard.name, self.admission.used,
            )  # fmt: skip
        if writing or changed or self.written:
            self.forget()
            scales_from(shard, private=not writing)
        self.written = writing

    def _parts(self) -> list[tuple[Rows, torch.Tensor]]:
        """The shard's weight and scale, each with the tier's rows of it."""
        pairs = ((self.shard.weight, self.weight), (self.shard.scale, self.scale))
        return [(part, mine) for part, mine in pairs if part is not None and mine is not None]

    def _move(self, change: Change, *, cold: bool = False) -> None:
        """Copy the admitted rows into their slots; `cold`: their pages may be out of the page cache (a
        warm start's, where an admission after a lookup copies rows the lookup just read)."""
        self.admissions += change.admitted.numel()
        self.evictions += change.evicted
        if not change.admitted.numel():
            return
        if cold and self.shard.readahead:  # a file on disk: its pages asked for at once, sorted and coalesced
            read_ahead(self.shard, change.admitted)
        try:
            self._copy(change, self._parts())
        except BaseException:  # the index names rows whose bytes never came: hold none rather than serve them
            self.admission.warm(change.admitted[:0])
            raise

    def _copy(self, change: Change, parts: list[tuple[Rows, torch.Tensor]]) -> None:
        """The admitted rows of each (shard part, tier rows) pair copied from the part into their slots."""
        with files_named_on_fault(self.shard):
            for part, mine in parts:
                for start in range(0, change.admitted.numel(), CANDIDATE_CHUNK):  # a few MB in flight at most
                    chunk = change.admitted[start : start + CANDIDATE_CHUNK]
                    rows = stored_rows(self.shard, part, chunk, self.device)
                    slots = change.slots[start : start + CANDIDATE_CHUNK].to(self.device)
                    mine.view(torch.uint8).index_copy_(0, slots, rows.view(torch.uint8))

    def stats(self) -> TierStats:
        """Its counters (reading them waits for the lookups queued so far on a GPU)."""
        hits, looked_up, owned_misses = self.counts.tolist()
        row_bytes = self.shard.format.row_bytes
        held = self.weight.numel() * self.weight.element_size()
        held += 0 if self.scale is None else self.scale.numel() * self.scale.element_size()
        return TierStats(
            self.name, self.policy, self.capacity, self.admission.used,
            held + self.admission.nbytes + self.own_bytes + self.scale_bytes, looked_up, hits, looked_up - hits,
            self.refreshes, self.admissions, self.evictions, self.admissions * row_bytes, hits * row_bytes,
            owned_misses * row_bytes,
        )  # fmt: skip
