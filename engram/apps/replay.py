"""What a tier of hot rows would hit on a user's own traffic: the token stream replayed, in order and in
steps of STEP_TOKENS, through the tiers' own admission (engram.runtime.tiers: WindowedAdmission and
ClockAdmission, the code that serves), for each budget (a fraction of each table's rows) and policy:

- "online": the tier starts empty (or from the static profile's rows, `warm`) and refreshes from the
  served ids exactly as a DeviceTier does: once a window of WINDOW_IDS ids has been looked up, before the next
  step, from the latest WINDOW_IDS of them;
- "static": the tier holds the rows most frequent in the fit text and never changes.

Tier "device" refreshes once a window was served (WindowedAdmission); tier "ram", the tier over a file on disk,
admits after every lookup (ClockAdmission), a step being one lookup of each table. A step's hits are
counted before its ids are recorded, as a lookup reads the tier before the refresh or admission that
follows it. Hits and lookups are summed over the tables, per window of `window_tokens` tokens."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.tiers.budget import HALF_LIFE, WINDOW_IDS, Policy, TierName, state_bytes
from engram.runtime.tiers.clock import ClockAdmission
from engram.runtime.tiers.windowed import WindowedAdmission
from engram.terminal import size_text

STEP_TOKENS = 512


@dataclass
class Window:
    tokens: int
    lookups: int = 0
    hits: int = 0


@dataclass
class Replay:
    """One budget and policy over the stream: its windows in stream order."""

    policy: Policy
    cache_fraction: float
    rows: dict[str, int]  # each table's tier, in rows
    tier: TierName = "device"
    windows: list[Window] = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        lookups = sum(w.lookups for w in self.windows)
        return sum(w.hits for w in self.windows) / lookups if lookups else 0.0


CHUNK_TOKENS = 64 * STEP_TOKENS  # tokens hashed at a time: their ids are all of the stream in memory at once
Counts = tuple[torch.Tensor, torch.Tensor]  # distinct row ids, ascending, and how often each was seen


def stream_ids(spec: ModelSpec, tokens: torch.Tensor) -> Iterator[dict[str, torch.Tensor]]:
    """Each table's row ids for the stream, [tokens, lookups per token] (its layers' columns), in order,
    CHUNK_TOKENS at a time: the hash's state is carried from one chunk to the next, so the ids are those
    of the stream hashed whole, and a 10 GB text never asks for its ids in one allocation."""
    hasher, state = spec.hasher(), None
    layout = spec.layout
    columns = {
        name: [i for i, t in enumerate(layout.table_of_layer) if t == table]
        for table, name in enumerate(spec.table_names())
    }
    for start in range(0, tokens.numel(), CHUNK_TOKENS):
        part = tokens[start : start + CHUNK_TOKENS]
        compressed = spec.compress(part) if spec.family == "deepseek" else part
        rows, state = hasher.hash_with_state(compressed, None, state)  # [T, layers, columns]
        yield {name: rows[:, layers].reshape(rows.shape[0], -1) for name, layers in columns.items()}


def counted(spec: ModelSpec, tokens: torch.Tensor, limit_bytes: int) -> dict[str, Counts]:
    """How often each row of each table is looked up over the stream, counted a chunk at a time. The
    distinct rows are what stays in memory: past `limit_bytes` of them, EngramError with the figure."""
    out: dict[str, Counts] = {}
    for chunk in stream_ids(spec, tokens):
        for name, ids in chunk.items():
            distinct, counts = torch.unique(ids.reshape(-1), return_counts=True)
            if name in out:
                distinct, inverse = torch.unique(torch.cat([out[name][0], distinct]), return_inverse=True)
                counts = torch.zeros(distinct.numel(), dtype=torch.int64).index_add_(
                    0, inverse, torch.cat([out[name][1], counts])
                )
            out[name] = (distinct, counts)
        held = sum(d.numel() * 16 for d, _ in out.values())
        if held > limit_bytes:
            raise EngramError(
                f"--fit: counting its rows takes more than {size_text(held)}, past the {size_text(max(0, limit_bytes))} "
                "free for it; give a shorter --fit text or a smaller --max-tokens"
            )
    return out


def hottest(counts: Counts, count: int) -> Counts:
    """The `count` most frequent rows, most frequent first (ties: the smaller id first), and their counts."""
    distinct, seen = counts
    order = torch.argsort(seen, descending=True, stable=True)[:count]
    return distinct[order], seen[order]


@dataclass
class _Table:
    """One table's admission in one replay, and the ids it has served since its last refresh."""

    admission: WindowedAdmission | ClockAdmission
    windows: list[Window]
    pending: list[torch.Tensor] = field(default_factory=list)
    since: int = 0


def replay_bytes(
    spec: ModelSpec, fractions: Iterable[float], policies: Iterable[Policy], tiers: Iterable[TierName], window_ids: int
) -> int:
    """What replay's tiers hold at once (each one's own state, as a tier's: state_bytes), and a chunk of
    the stream's ids with its hash's working set."""
    columns = spec.layout.columns * len(spec.layout.table_of_layer)
    total = CHUNK_TOKENS * columns * 8 * 4
    for fraction in fractions:
        for policy in policies:
            for tier in tiers:
                for rows in spec.layout.table_rows:
                    held = max(1, int(fraction * rows))
                    total += state_bytes(held, rows, 0 if tier == "ram" else window_ids, policy, tier == "ram")
    return total


def replay(
    spec: ModelSpec,
    tokens: torch.Tensor,
    fractions: Iterable[float],
    policies: Iterable[Policy],
    *,
    fit: dict[str, Counts] | None = None,
    window_tokens: int = 8192,
    window_ids: int = WINDOW_IDS,
    half_life: int = HALF_LIFE,
    tiers: Iterable[TierName] = ("device",),
) -> list[Replay]:
    """Every (fraction, policy, tier) replayed over the token stream `tokens` at once, its ids hashed a
    chunk at a time (stream_ids); `fit` (counted() of the fit text) picks the static rows, and warms the
    online tier when given."""
    table_rows = dict(zip(spec.table_names(), spec.layout.table_rows, strict=True))
    out: list[Replay] = []
    runs: list[dict[str, _Table]] = []
    for fraction in fractions:
        for policy in policies:
            if policy == "static" and fit is None:
                raise EngramError("a static tier is fitted on text: give --fit FILE")
            for tier in tiers:
                rows = {name: max(1, int(fraction * table_rows[name])) for name in table_rows}
                windows = [
                    Window(min(window_tokens, tokens.numel() - at)) for at in range(0, tokens.numel(), window_tokens)
                ]
                out.append(Replay(policy, fraction, rows, tier, windows))
                run = {}
                for name in table_rows:
                    span = (0, table_rows[name])
                    admission = (
                        ClockAdmission(rows[name], span, policy=policy)
                        if tier == "ram"
                        else WindowedAdmission(
                            rows[name], span, policy=policy, half_life=half_life, window_ids=window_ids
                        )
                    )
                    if fit is not None:
                        admission.warm(*hottest(fit[name], rows[name]))
                    run[name] = _Table(admission, windows)
                runs.append(run)
    at = 0
    for chunk in stream_ids(spec, tokens):
        for run in runs:
            for name, ids in chunk.items():
                _replay_chunk(run[name], ids, at, window_tokens, window_ids)
        at += next(iter(chunk.values())).shape[0]
    return out


def _replay_chunk(table: _Table, ids: torch.Tensor, at: int, window_tokens: int, window_ids: int) -> None:
    """A chunk of one table's stream (from token `at`, a multiple of STEP_TOKENS) through its admission,
    its hits and lookups added to its windows."""
    admission = table.admission
    for start in range(0, ids.shape[0], STEP_TOKENS):
        if isinstance(admission, WindowedAdmission) and admission.policy == "online" and table.since >= window_ids:
            admission.refresh(torch.cat(table.pending)[-window_ids:])
            table.pending, table.since = [], 0
        step = ids[start : start + STEP_TOKENS]
        _count(table.windows, at + start, admission.hits(step).view(step.shape), window_tokens)
        if isinstance(admission, ClockAdmission):
            admission.admit(step)
            continue
        table.pending.append(step.reshape(-1))
        table.since += step.numel()


def _count(windows: list[Window], start: int, hits: torch.Tensor, window_tokens: int) -> None:
    """Add a step's hits ([tokens, lookups], from token `start`) to the windows its tokens fall in."""
    per_token = hits.sum(dim=1)
    token = start
    while token < start + hits.shape[0]:
        index = token // window_tokens
        stop = min(start + hits.shape[0], (index + 1) * window_tokens)
        windows[index].lookups += (stop - token) * hits.shape[1]
        windows[index].hits += int(per_token[token - start : stop - start].sum())
        token = stop
