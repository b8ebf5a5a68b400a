"""The plugin's counters (engram.integrations.vllm.metrics) against counts made here: what each table's
lookups add to a series is exactly its own ids, for tables built where freed ones were and for a tier
replaced by a new one. prometheus_client's counters are stood in for by ones that record each increment
(it is vLLM's dependency, not engram's)."""

from __future__ import annotations

import gc
from collections import defaultdict
from typing import Any

import torch

from engram.integrations.vllm.metrics import COUNTERS, Metrics
from engram.runtime.table import Table
from tests.runtime.shards import random_shard


class Series:
    def __init__(self) -> None:
        self.total = 0
        self.value = 0

    def inc(self, amount: int) -> None:
        assert amount > 0
        self.total += amount

    def set(self, value: int) -> None:
        self.value = value


class Family:
    def __init__(self) -> None:
        self.series: defaultdict[tuple[str, ...], Series] = defaultdict(Series)

    def labels(self, *labels: str) -> Series:
        return self.series[labels]


def recording() -> tuple[Metrics, dict[str, Family]]:
    metrics = Metrics()
    families: dict[str, Any] = {name: Family() for name in [*COUNTERS, "engram_tier_rows"]}
    metrics._metrics = families
    return metrics, families


def test_tables_built_where_freed_ones_were_count_only_their_own_lookups() -> None:
    metrics, families = recording()
    generator = torch.Generator().manual_seed(1)
    looked_up = 0
    for index in range(15):
        table = Table(random_shard(64, "bf16", seed=index, dim=8), 64)
        for _ in range(int(torch.randint(1, 4, (1,), generator=generator))):
            ids = torch.randint(0, 64, (int(torch.randint(1, 50, (1,), generator=generator)),), generator=generator)
            table.lookup(ids)
            looked_up += ids.numel()
        metrics.publish("t", table)
        assert families["engram_lookups"].series[("t", "none", "0")].total == looked_up
        del table
        gc.collect()  # the next table may be built at this one's address


def test_a_replaced_tier_counts_from_zero() -> None:
    metrics, families = recording()
    table = Table(random_shard(4096, "bf16", seed=3, dim=8), 4096)
    generator = torch.Generator().manual_seed(2)
    served = []
    for _ in range(2):  # a tier, then a new one in its place
        assert table.keep_hot(1 << 20, "cpu", window_ids=256)
        for _ in range(5):
            table.lookup(torch.randint(0, 4096, (300,), generator=generator))
        table.refresh()
        assert table.tier is not None
        served.append(table.tier.stats().lookups)
        metrics.publish("t", table)
    assert families["engram_tier_lookups"].series[("t", "device", "0")].total == sum(served)
