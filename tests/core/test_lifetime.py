# SPDX-License-Identifier: Apache-2.0
"""Lifetime: entries die with their owner by reference counting alone; close() empties."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import stepcache
from stepcache import StaleCacheError, step_cached
from stepcache._store import live_caches


@pytest.fixture
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@dataclasses.dataclass
class Meta:
    qsl: torch.Tensor
    n: int

    @step_cached(depends_on=("qsl", "n"))
    def index(self) -> torch.Tensor:
        return torch.repeat_interleave(
            torch.arange(self.qsl.numel() - 1), self.qsl.diff()
        )

    @step_cached(key="kind")
    def pair(self, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(self.n), torch.ones(self.n)

    @step_cached()
    def unbound(self) -> torch.Tensor:
        return torch.zeros(3)


def test_dropping_the_owner_frees_entries_without_gc(no_gc: None) -> None:
    m = Meta(torch.tensor([0, 2, 5]), 5)
    values = [m.index(), *m.pair("a"), m.unbound()]
    refs = [weakref.ref(v) for v in values]
    store_ref = weakref.ref(stepcache.cache_of(m))
    del values
    assert all(r() is not None for r in refs)
    del m
    assert store_ref() is None
    assert all(r() is None for r in refs)


def test_kept_objects_die_with_the_owner(no_gc: None) -> None:
    m = Meta(torch.tensor([0, 1]), 1)
    staging = torch.zeros(4)
    stepcache.cache_of(m).keep_alive(staging)
    ref = weakref.ref(staging)
    del staging
    assert ref() is not None
    del m
    assert ref() is None


def test_close_holds_nothing_and_refuses_later_use(no_gc: None) -> None:
    m = Meta(torch.tensor([0, 2, 5]), 5)
    ref = weakref.ref(m.index())
    store = stepcache.cache_of(m)
    store.keep_alive(torch.zeros(1))
    store.close()
    assert store.closed and len(store) == 0 and not store._kept
    assert ref() is None
    with pytest.raises(StaleCacheError, match="closed"):
        m.index()
    with pytest.raises(StaleCacheError, match="closed"):
        stepcache.cache_of(m)


def test_clear_empties_but_keeps_the_store_open() -> None:
    m = Meta(torch.tensor([0, 2]), 2)
    first = m.index()
    stepcache.cache_of(m).clear()
    assert len(stepcache.cache_of(m)) == 0
    assert m.index() is not first
    assert stepcache.stats()["Meta.index"].misses == 2


def test_live_bytes_follow_live_entries(no_gc: None) -> None:
    m = Meta(torch.tensor([0, 2, 5]), 5)
    m.pair("a")
    row = stepcache.stats()["Meta.pair"]
    assert row.live_entries == 1
    assert row.live_bytes == 2 * 5 * 4
    del m
    assert stepcache.stats()["Meta.pair"].live_entries == 0
    assert stepcache.stats()["Meta.pair"].live_bytes == 0


class Closing:
    """Its cached functions close the owner's store while they compute, as another
    thread ending the step would."""

    def __init__(self) -> None:
        self.qsl = torch.tensor([0, 1])

    @step_cached(depends_on=("qsl",))
    def index(self) -> torch.Tensor:
        stepcache.cache_of(self).close()
        return self.qsl.clone()

    @step_cached(key="kind")
    def pair(self, kind: str) -> torch.Tensor:
        stepcache.cache_of(self).close()
        return torch.zeros(2)


@pytest.mark.parametrize("fresh", [False, True], ids=["store", "fresh owner"])
@pytest.mark.parametrize("call", [Closing.index, lambda o: Closing.pair(o, "a")])
def test_a_store_closed_during_a_miss_keeps_nothing(call: object, fresh: bool) -> None:
    owner = Closing()  # fresh: its store is made by the call that closes it
    store = None if fresh else stepcache.cache_of(owner)
    assert callable(call)
    value = call(owner)
    assert isinstance(value, torch.Tensor)  # the caller still gets its value
    store = store or vars(owner)["_stepcache"]
    assert store.closed and len(store) == 0 and list(store.entries()) == []
    with pytest.raises(StaleCacheError, match="closed"):
        call(owner)


def test_a_fresh_owner_gets_its_store_on_the_first_call() -> None:
    m = Meta(torch.tensor([0, 2]), 2)
    assert "_stepcache" not in vars(m)
    first = m.index()
    store = vars(m)["_stepcache"]
    assert isinstance(store, stepcache.StepCache) and store in live_caches()
    assert stepcache.cache_of(m) is store and len(store) == 1
    assert m.index() is first


_TRACKING_SCRIPT = """
import gc
from typing import Any
import torch
import stepcache
from stepcache import _store

class Meta:
    def __init__(self, n):
        self.qsl = torch.arange(n + 1)

    @stepcache.step_cached(depends_on=("qsl",), name="t.rows")
    def rows(self):
        return self.qsl.diff()

early = [Meta(n) for n in (1, 2, 3)]
for m in early:
    m.rows()
dead = Meta(4)
dead.rows()
del dead
# not tracked yet: no store registered itself
assert not _store.TRACKING[0] and len(_store._live) == 0
# the first call finds the live stores by scanning the heap, and only those
found = _store.live_caches()
assert _store.TRACKING[0]
assert {id(s) for s in found} == {id(stepcache.cache_of(m)) for m in early}, found
assert stepcache.stats()["t.rows"].live_entries == 3
del found
# from now on a new store registers itself, and leaves when its owner goes
late = Meta(5)
late.rows()
assert len(_store.live_caches()) == 4
assert stepcache.stats()["t.rows"].live_entries == 4
del early[0], late
assert len(_store.live_caches()) == 2
assert stepcache.stats()["t.rows"].live_entries == 2
print("ok")
"""


def test_stores_are_tracked_from_the_first_live_caches_call() -> None:
    # a fresh interpreter: whether stores are tracked is process-wide, and this one's
    # tests have long asked for stats()
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _TRACKING_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ok")


def test_a_factory_s_functions_leave_nothing_behind_once_gone() -> None:
    import tracemalloc

    class Meta:
        pass

    def factory() -> Any:
        @step_cached(name="lifetime.factory")
        def build(md: Meta) -> int:
            return 1

        return build

    def rounds(n: int) -> None:
        for _ in range(n):
            factory()(Meta())

    rounds(200)  # warm: first-use allocations
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        rounds(1000)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    # a decorated function's hit source alone is over 1 KiB
    assert grown / 1000 < 500, f"{grown / 1000:.0f} bytes left per function"
