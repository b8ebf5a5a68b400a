"""The device tier (device_cache_bytes): hot rows of a table in memory, in `device` memory, chosen between
steps from a window of the ids served (WindowedAdmission). Every lookup appends its ids to a ring on the
tier's device (one index_copy_, static shapes, capturable: a CUDA graph replay records its ids too).
Between steps, once a window of ids has been served, `refresh` reads one count back to the host, lets the
admission choose, and copies the rows admitted into the slots of those evicted; the lookups themselves
never wait for it, and it never runs inside a capture."""

from __future__ import annotations

import torch

from engram.errors import EngramError
from engram.runtime.shard import TableShard
from engram.runtime.tiers.base import TierBase
from engram.runtime.tiers.budget import HALF_LIFE, WINDOW_IDS, Policy
from engram.runtime.tiers.hot_rows import HotRows
from engram.runtime.tiers.windowed import WindowedAdmission


class DeviceTier(TierBase):
    """Hot rows of one shard in memory, kept in `device` memory (module docstring)."""

    admission: WindowedAdmission

    def __init__(
        self,
        shard: TableShard,
        capacity: int,
        device: torch.device | str,
        *,
        policy: Policy = "online",
        window_ids: int = WINDOW_IDS,
        half_life: int = HALF_LIFE,
        scale_bytes: int = 0,
    ) -> None:
        rows = (shard.row_start, shard.row_stop)
        admission = WindowedAdmission(capacity, rows, device, policy=policy, half_life=half_life, window_ids=window_ids)
        super().__init__(shard, admission, device, "device", scale_bytes=scale_bytes)
        self.rows = HotRows(admission.keys, self.weight, self.scale, admission.slots)
        self.window_ids = window_ids
        self._ring = torch.zeros(window_ids if policy == "online" else 0, dtype=torch.int64, device=device)
        self._steps = torch.arange(self._ring.numel(), dtype=torch.int64, device=device)
        self._served = torch.zeros((), dtype=torch.int64, device=device)  # ids appended since the last refresh
        self.since = 0  # ids the host saw looked up since the last refresh (graph replays not among them)

    @property
    def own_bytes(self) -> int:
        return self._ring.numel() * 16

    @property
    def windowed(self) -> bool:
        return True

    @property
    def due(self) -> bool:
        """Whether a window of ids was served since the last refresh (as far as the host saw)."""
        return self._ring.numel() > 0 and self.since >= self.window_ids

    def sees(self, ids: torch.Tensor) -> None:
        """Refresh first if a window was served (between this table's lookups of two steps; never while a
        CUDA stream captures), then keep the ids."""
        if self.due and not (ids.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.refresh()
        self.record(ids)

    def record(self, ids: torch.Tensor) -> None:
        """Append a lookup's ids to the ring (the latest window_ids of them if more): device ops only."""
        if not self._ring.numel():
            return
        flat = ids.reshape(-1)[-self._ring.numel() :].to(device=self.device, dtype=torch.int64)
        at = (self._served + self._steps[: flat.numel()]) % self._ring.numel()
        self._ring.index_copy_(0, at, flat)
        self._served += flat.numel()
        self.since += ids.numel()

    def refresh(self) -> int:
        """Admit the hottest rows of the latest window (module docstring); the rows admitted. Call it
        between steps, never while a CUDA stream captures."""
        if not self._ring.numel():
            return 0
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise EngramError("a tier refreshes between steps, not while a CUDA graph is being captured")
        served = min(int(self._served), self._ring.numel())  # the one read back to the host
        change = self.admission.refresh(self._ring[:served])
        self._served.zero_()
        self.since = 0
        self.refreshes += 1
        self._move(change)
        return change.admitted.numel()
