# SPDX-License-Identifier: Apache-2.0
"""stats(): per-function counters across the process, and a readable table."""

from __future__ import annotations

import copy
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


class Kinds:
    def __init__(self) -> None:
        self.qsl = torch.arange(3)

    @step_cached(key="kind", depends_on=("qsl",), name="stats.kinds")
    def pair(self, kind: str) -> str:
        return kind

    @step_cached(depends_on=("qsl",), name="stats.other")
    def other(self) -> int:
        return 0


def test_a_store_counts_each_function_over_keys_and_invalidations(
    persistent: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    m = Kinds()
    m.qsl = persistent(m.qsl)
    for kind in ("a", "b", "a", "b"):
        m.pair(kind)
    m.other()
    m.qsl.add_(1)  # both kinds' entries no longer serve
    m.pair("a")
    m.pair("b")
    with stepcache.debug("checks"):  # where the slow path counts
        m.qsl.add_(1)
        m.pair("a")
    per_store = stepcache.cache_of(m).stats()
    kinds = per_store["stats.kinds"]
    assert (kinds["entries"], kinds["misses"], kinds["invalidations"]) == (2, 5, 3)
    other = per_store["stats.other"]
    assert (other["entries"], other["misses"], other["invalidations"]) == (1, 1, 0)
    row = stepcache.stats()["stats.kinds"]
    assert (row.hits, row.misses, row.invalidations) == (2, 5, 3)


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


def test_an_entry_shared_by_copies_of_its_owner_is_counted_once() -> None:
    md = Meta()
    md.index()
    copies = [copy.copy(md) for _ in range(3)]
    stores = [stepcache.cache_of(c) for c in copies]  # each seeded with md's entry
    assert len({id(s) for s in stores} | {id(stepcache.cache_of(md))}) == 4
    assert all(c.index() is md.index() for c in copies)
    row = stepcache.stats()["stats.index"]
    assert (row.live_entries, row.live_bytes) == (1, 40)


def test_functions_that_share_a_name_share_its_row() -> None:
    def make() -> Callable[[Meta], int]:
        @step_cached(name="stats.factory")
        def build(md: Meta) -> int:
            return 1

        return build

    first, second = make(), make()
    md = Meta()
    first(md), first(md), second(md)
    table = stepcache.stats()
    assert [n for n in table if n == "stats.factory"] == ["stats.factory"]
    row = table["stats.factory"]
    assert (row.hits, row.misses, row.live_entries) == (1, 2, 2)
    assert table.to_dict()["stats.factory"]["misses"] == 2
    assert stepcache.cache_of(md).stats()["stats.factory"]["misses"] == 2
