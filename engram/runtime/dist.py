"""Small collectives over torch.distributed CPU (gloo) groups, each bounded by a timeout whose error says
which rank is missing. Messages travel as JSON in byte tensors: no pickle between processes."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from engram.errors import EngramError

DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_RANGE_S = (1.0, 7 * 24 * 3600.0)  # below a second the rendezvous itself cannot finish


def timeout_s() -> float:
    """ENGRAM_DIST_TIMEOUT_S bounds every wait between ranks (default 300 s)."""
    raw = os.environ.get("ENGRAM_DIST_TIMEOUT_S")
    return DEFAULT_TIMEOUT_S if raw is None else parse_timeout(raw)


def parse_timeout(raw: str, name: str = "ENGRAM_DIST_TIMEOUT_S") -> float:
    """The seconds the variable `name` says, `raw`, within TIMEOUT_RANGE_S; an error naming it otherwise."""
    try:
        value = float(raw)
    except ValueError:
        raise EngramError(f"{name}={raw[:50]!r} is not a number of seconds") from None
    low, high = TIMEOUT_RANGE_S
    if not low <= value <= high:  # also refuses nan and inf
        raise EngramError(f"{name}={raw[:50]!r} must be between {low:g} and {high:g} seconds")
    return value


@dataclass(frozen=True)
class Group:
    """A gloo group and what its members are, for messages: `ranks` are global ranks, in group order."""

    handle: Any  # dist.ProcessGroup
    ranks: tuple[int, ...]
    label: str
    timeout: float

    @property
    def rank(self) -> int:
        return dist.get_rank(self.handle)

    @property
    def size(self) -> int:
        return len(self.ranks)


def new_group(ranks: list[int], label: str, timeout: float | None = None) -> Group:
    """Every process must call this for every group, in the same order (torch.distributed's rule)."""
    seconds = timeout_s() if timeout is None else timeout
    handle = dist.new_group(ranks, backend="gloo", timeout=timedelta(seconds=seconds))
    return Group(handle, tuple(ranks), label, seconds)


def _failed(group: Group, step: str, exc: BaseException) -> EngramError:
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return EngramError(
        f"{group.label}: ranks {list(group.ranks)} did not all reach '{step}' within {group.timeout:g} s "
        f"(this is rank {dist.get_rank()}): {detail}"
    )


def barrier(group: Group, step: str) -> None:
    """A barrier that names the ranks that did not arrive (gloo's monitored barrier)."""
    if group.size == 1:
        return
    try:
        dist.monitored_barrier(group=group.handle, timeout=timedelta(seconds=group.timeout), wait_all_ranks=True)
    except (RuntimeError, dist.DistError) as exc:
        raise _failed(group, step, exc) from None


def broadcast_json(group: Group, value: Any, step: str, src: int = 0) -> Any:
    """`value` of group rank `src` on every rank."""
    if group.size == 1:
        return value
    try:
        payload = json.dumps(value).encode() if group.rank == src else b""
        length = torch.tensor([len(payload)], dtype=torch.int64)
        dist.broadcast(length, group_src=src, group=group.handle)
        data = (
            torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            if payload
            else torch.empty(int(length), dtype=torch.uint8)
        )
        dist.broadcast(data, group_src=src, group=group.handle)
    except (RuntimeError, dist.DistError) as exc:
        raise _failed(group, step, exc) from None
    return json.loads(bytes(data.tolist()).decode())


def all_gather_json(group: Group, value: Any, step: str) -> list[Any]:
    """Every rank's `value`, in group order."""
    if group.size == 1:
        return [value]
    try:
        payload = json.dumps(value).encode()
        length = torch.tensor([len(payload)], dtype=torch.int64)
        lengths = [torch.empty(1, dtype=torch.int64) for _ in range(group.size)]
        dist.all_gather(lengths, length, group=group.handle)
        longest = max(int(n) for n in lengths)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else mine[:0]
        gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(group.size)]
        dist.all_gather(gathered, mine, group=group.handle)
    except (RuntimeError, dist.DistError) as exc:
        raise _failed(group, step, exc) from None
    return [json.loads(bytes(g[: int(n)].tolist()).decode()) for g, n in zip(gathered, lengths, strict=True)]
