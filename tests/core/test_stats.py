# SPDX-License-Identifier: Apache-2.0
"""stats(): per-function counters across the process, and a readable table."""

from __future__ import annotations

from collections.abc import Callable

import torch

import stepcache
from stepcache import step_cached


class Meta:
    def __init__(self) -> None:
        self.qsl = torch.arange(3)

    @step_cached(depends_on=("qsl",), name="stats.index")
    def index(self) -> torch.Tensor:
        return torch.zeros(10, dtype=torch.int32)


def test_counts_hits_misses_invalidations_and_bytes(
    persistent: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    m = Meta()
    m.qsl = persistent(m.qsl)  # written in place below: a persistent buffer
    m.index()
    m.index()
    m.qsl.add_(1)  # in place: the entry is invalidated
    m.index()
    m.index()
    row = stepcache.stats()["stats.index"]
    assert (row.hits, row.misses, row.invalidations, row.bypasses) == (2, 2, 1, 0)
    assert (row.live_entries, row.live_bytes) == (1, 40)
    assert row.calls == 4 and row.hit_rate == 0.5
    per_store = stepcache.cache_of(m).stats()["stats.index"]
    assert per_store == {
        "entries": 1,
        "bytes": 40,
        "misses": 2,
        "invalidations": 1,
    }


def test_table_renders_every_column() -> None:
    Meta().index()
    text = str(stepcache.stats())
    header = text.splitlines()[0].split()
    assert header == [
        "function",
        "hits",
        "misses",
        "bypasses",
        "invalidations",
        "live",
        "bytes",
    ]
    assert any(line.startswith("stats.index") for line in text.splitlines())
    assert stepcache.stats().to_dict()["stats.index"]["misses"] == 1


def test_reset_zeroes_counters() -> None:
    m = Meta()
    m.index()
    m.index()
    stepcache.reset_stats()
    assert (
        "stats.index" not in stepcache.stats()
        or stepcache.stats()["stats.index"].calls == 0
    )
    assert stepcache.stats(include_idle=True)["stats.index"].hits == 0
