"""What a tier of hot rows would hit on a user's own traffic: the token stream replayed, in order and in
steps of STEP_TOKENS, through the tiers' own admission (engram.runtime.tier.Admission, the code that
serves), for each budget (a fraction of each table's rows) and policy:

- "online": the tier starts empty (or from the static profile's rows, `warm`) and refreshes from the
  served ids exactly as a Tier does: once a window of WINDOW_IDS ids has been looked up, before the next
  step, from the latest WINDOW_IDS of them;
- "static": the tier holds the rows most frequent in the fit text and never changes.

Tier "device" refreshes once a window was served (Admission); tier "ram", the tier over a file on disk,
admits after every lookup (EagerAdmission), a step being one lookup of each table. A step's hits are
counted before its ids are recorded, as a lookup reads the tier before the refresh or admission that
follows it. Hits and lookups are summed over the tables, per window of `window_tokens` tokens."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec
from engram.runtime.tier import HALF_LIFE, WINDOW_IDS, Admission, EagerAdmission, Policy, TierName

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


def table_ids(spec: ModelSpec, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each table's row ids for the stream, [T, lookups per token] (its layers' columns), in order."""
    compressed = spec.compress(tokens) if spec.family == "deepseek" else tokens
    rows: torch.Tensor = spec.hasher().hash(compressed)  # [T, layers, columns]
    layout = spec.layout
    return {
        name: rows[:, [i for i, t in enumerate(layout.table_of_layer) if t == table]].reshape(rows.shape[0], -1)
        for table, name in enumerate(spec.table_names())
    }


def hottest(ids: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` most frequent ids, most frequent first (ties: the smaller id first), and their counts."""
    distinct, counts = torch.unique(ids.reshape(-1), return_counts=True)
    order = torch.argsort(counts, descending=True, stable=True)[:count]
    return distinct[order], counts[order]


def replay(
    spec: ModelSpec,
    stream: dict[str, torch.Tensor],
    fractions: Iterable[float],
    policies: Iterable[Policy],
    *,
    fit: dict[str, torch.Tensor] | None = None,
    window_tokens: int = 8192,
    window_ids: int = WINDOW_IDS,
    half_life: int = HALF_LIFE,
    tiers: Iterable[TierName] = ("device",),
) -> list[Replay]:
    """Every (fraction, policy, tier) replayed over `stream` (table_ids of the served text); `fit`
    (table_ids of the fit text) picks the static rows, and warms the online tier when given."""
    table_rows = dict(zip(spec.table_names(), spec.layout.table_rows, strict=True))
    out = []
    for fraction in fractions:
        for policy in policies:
            if policy == "static" and fit is None:
                raise EngramError("a static tier is fitted on text: give --fit FILE")
            for tier in tiers:
                rows = {name: max(1, int(fraction * table_rows[name])) for name in stream}
                tokens = next(iter(stream.values())).shape[0]
                windows = [Window(min(window_tokens, tokens - at)) for at in range(0, tokens, window_tokens)]
                result = Replay(policy, fraction, rows, tier, windows)
                for name, ids in stream.items():
                    span = (0, table_rows[name])
                    admission = (
                        EagerAdmission(rows[name], span, policy=policy)
                        if tier == "ram"
                        else Admission(rows[name], span, policy=policy, half_life=half_life, window_ids=window_ids)
                    )
                    if fit is not None:
                        admission.warm(*hottest(fit[name], rows[name]))
                    _replay_table(admission, ids, window_tokens, window_ids, result.windows)
                out.append(result)
    return out


def _replay_table(
    admission: Admission | EagerAdmission, ids: torch.Tensor, window_tokens: int, window_ids: int, windows: list[Window]
) -> None:
    """One table's stream through `admission`, its hits and lookups added to `windows`."""
    pending: list[torch.Tensor] = []
    since = 0
    for start in range(0, ids.shape[0], STEP_TOKENS):
        if isinstance(admission, Admission) and admission.policy == "online" and since >= window_ids:
            admission.refresh(torch.cat(pending)[-window_ids:])
            pending, since = [], 0
        step = ids[start : start + STEP_TOKENS]
        _count(windows, start, admission.hits(step).view(step.shape), window_tokens)
        if isinstance(admission, EagerAdmission):
            admission.admit(step)
            continue
        pending.append(step.reshape(-1))
        since += step.numel()


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
