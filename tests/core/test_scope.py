# SPDX-License-Identifier: Apache-2.0
"""``stepcache.scope()``: a lifetime the engine opens (one metadata build). Inside it,
owners built from the same inputs share one value, inference tensors are matched by
identity, and everything made in it is dropped when it closes."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from typing import Any

import pytest
import torch

import stepcache
from stepcache import StaleCacheError, StepCacheError, step_cached


@dataclasses.dataclass
class Group:
    """One KV-cache group's metadata: its own object, the build's layout tensors."""

    query_start_loc: torch.Tensor
    num_actual_tokens: int
    calls: list[str] = dataclasses.field(default_factory=list)

    @step_cached(depends_on=("query_start_loc", "num_actual_tokens"), name="scope.lens")
    def lens(self) -> torch.Tensor:
        self.calls.append("lens")
        return self.query_start_loc.diff()

    @step_cached(key="k", depends_on=("query_start_loc",), name="scope.keyed")
    def keyed(self, k: int) -> int:
        self.calls.append(f"keyed{k}")
        return int(self.query_start_loc[-1]) * k

    @step_cached(name="scope.bound")
    def bound(self) -> int:
        self.calls.append("bound")
        return id(self)


def layout(inference: bool = True) -> torch.Tensor:
    with torch.inference_mode(inference):
        return torch.tensor([0, 2, 5])


def test_owners_of_one_build_share_a_value_computed_once() -> None:
    qsl = layout()
    with stepcache.scope():
        groups = [Group(qsl, 5) for _ in range(4)]
        values = [g.lens() for g in groups]
        keyed = [g.keyed(2) for g in groups] + [g.keyed(3) for g in groups]
    assert all(v is values[0] for v in values)
    assert sum(len(g.calls) for g in groups) == 3  # lens, keyed2, keyed3: once each
    assert keyed == [10] * 4 + [15] * 4


def test_outside_a_scope_each_owner_computes_its_own() -> None:
    qsl = layout()
    groups = [Group(qsl, 5) for _ in range(3)]
    for g in groups:
        g.lens()
        g.lens()
    assert [g.calls for g in groups] == [["lens"]] * 3


def test_different_inputs_are_not_shared() -> None:
    # a scope keeps one entry per function and key, as a store shared with attach():
    # an owner with other inputs computes its own, and replaces it
    with stepcache.scope():
        a, b = Group(layout(), 5), Group(layout(), 5)  # equal values, other tensors
        c = Group(a.query_start_loc, 4)
        values = [a.lens(), b.lens(), c.lens()]
        assert len({id(v) for v in values}) == 3
        assert c.lens() is values[2]
        assert a.lens() is not values[0]  # computed again: c's entry replaced a's
    assert [a.calls, b.calls, c.calls] == [["lens", "lens"], ["lens"], ["lens"]]


def test_an_entry_without_dependencies_stays_bound_to_its_owner() -> None:
    # nothing tells two owners' calls apart: as in a store shared with attach(), the
    # last owner's entry is the one kept, and another owner computes its own
    with stepcache.scope():
        a, b = Group(layout(), 5), Group(layout(), 5)
        assert (a.bound(), b.bound()) == (id(a), id(b))
        assert (b.bound(), a.bound()) == (id(b), id(a))
    assert [a.calls, b.calls] == [["bound"] * 2, ["bound"]]


def test_an_inference_dependency_is_matched_by_identity_inside_a_scope() -> None:
    # the scope is the promise that nothing writes it in place: a write is not seen
    qsl = layout()
    with stepcache.scope():
        g = Group(qsl, 5)
        first = g.lens()
        with torch.inference_mode():
            qsl[1] = 1  # breaks the promise
        assert g.lens() is first  # served: production does not look
        g.query_start_loc = layout()  # a new object: seen
        assert g.lens() is not first


def test_everything_made_in_a_scope_is_dropped_when_it_closes() -> None:
    qsl = layout()
    g = Group(qsl, 5)
    before = g.lens()  # the owner's own entry, from before the scope
    with stepcache.scope():
        assert g.lens() is before  # it still serves: an owner joins at a miss
        g.num_actual_tokens = 4
        inside = g.lens()  # a miss: g joins the scope, which keeps the new value
        assert Group(qsl, 4).lens() is inside
    assert g.calls == ["lens", "lens"]
    g.num_actual_tokens = 5
    assert g.lens() is before  # its own store is back, with its own entry
    h = Group(qsl, 5)
    with stepcache.scope():
        made = h.lens()
    assert h.lens() is not made  # computed anew: the scope's entry is gone
    assert h.calls == ["lens", "lens"]


def test_cache_of_inside_a_scope_is_the_scope_store_and_after_it_the_owners() -> None:
    g = Group(layout(), 5)
    own = stepcache.cache_of(g)
    with stepcache.scope() as scope:
        assert stepcache.cache_of(g) is scope.store is not own
    assert stepcache.cache_of(g) is own
    fresh = Group(layout(), 5)
    with stepcache.scope() as scope:
        assert stepcache.cache_of(fresh) is scope.store
    assert stepcache.cache_of(fresh) is not scope.store


def test_nested_scopes_see_the_outer_entries_and_drop_their_own() -> None:
    qsl = layout()
    with stepcache.scope() as outer:
        a = Group(qsl, 5)
        shared = a.lens()  # reads the scope's store without joining it
        assert stepcache.cache_of(a) is outer.store  # joins it
        with stepcache.scope() as inner:
            b = Group(qsl, 5)  # joins the inner scope
            assert stepcache.cache_of(a) is outer.store  # a stays in the outer one
            assert stepcache.cache_of(b) is inner.store
            assert a.lens() is shared
            in_inner = b.lens()  # the inner scope's own entry
            assert b.keyed(1) == 5
        assert stepcache.active_scope() is outer
        assert b.lens() is not in_inner  # dropped with the inner scope
        assert a.lens() is shared
    assert stepcache.active_scope() is None


def test_an_exception_inside_closes_the_scope_and_propagates() -> None:
    g = Group(layout(), 5)
    with pytest.raises(ZeroDivisionError), stepcache.scope() as scope:
        value = g.lens()
        1 / 0  # noqa: B018
    assert not scope.open and stepcache.active_scope() is None
    assert g.lens() is not value  # dropped


def test_a_value_used_after_its_scope_closed_stays_what_it_was() -> None:
    with stepcache.scope():
        g = Group(layout(), 5)
        value = g.lens()
    assert value.tolist() == [2, 3]  # values outlive the scope; only sharing ends
    with stepcache.debug("checks"), stepcache.scope():
        h = Group(layout(), 5)
        guarded = h.lens()
    with stepcache.debug("checks"):
        assert (guarded + 1).tolist() == [3, 4]  # no use-after-close: not a step end


def test_copies_made_inside_join_the_scope_and_start_afresh_after() -> None:
    qsl = layout()
    with stepcache.scope():
        g = Group(qsl, 5)
        value = g.lens()
        twin = copy.copy(g)
        assert twin.lens() is value
    later = copy.copy(g)
    assert later.lens() is not value


def test_attach_to_a_scope_store_joins_it() -> None:
    qsl = layout()
    own = Group(qsl, 5)
    mine = stepcache.cache_of(own)
    with stepcache.scope() as scope:
        stepcache.attach(own, scope.store)
        value = Group(qsl, 5).lens()
        assert own.lens() is value
    assert stepcache.cache_of(own) is mine


def test_a_scope_belongs_to_its_thread() -> None:
    qsl = layout()
    seen: dict[str, Any] = {}

    def other() -> None:
        seen["active"] = stepcache.active_scope()
        g = Group(qsl, 5)
        g.lens()
        seen["store"] = stepcache.cache_of(g)

    with stepcache.scope() as scope:
        a = Group(qsl, 5)
        a.lens()
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert seen["active"] is None
        assert seen["store"] is not scope.store  # not joined: its own store

    errors: list[BaseException] = []
    opened = stepcache.scope().__enter__()

    def close_elsewhere() -> None:
        try:
            opened.__exit__(None, None, None)
        except StepCacheError as exc:
            errors.append(exc)

    thread = threading.Thread(target=close_elsewhere)
    thread.start()
    thread.join()
    assert errors and "the thread that opened it" in str(errors[0])
    opened.__exit__(None, None, None)
    assert stepcache.active_scope() is None


def test_a_scope_belongs_to_its_asyncio_task() -> None:
    # two builds interleaved in one thread: each task sees only its own scope
    qsl = layout()
    seen: dict[str, Any] = {}

    async def build(name: str) -> None:
        with stepcache.scope() as scope:
            first = Group(qsl, 5)
            first.lens()
            await asyncio.sleep(0)  # the other task opens its scope meanwhile
            second = Group(qsl, 5)
            second.lens()  # served by this task's scope
            seen[name] = (stepcache.active_scope() is scope, first.calls + second.calls)

    async def main() -> None:
        await asyncio.gather(build("a"), build("b"))
        seen["after"] = stepcache.active_scope()

    asyncio.run(main())
    assert seen["a"] == (True, ["lens"]) and seen["b"] == (True, ["lens"])
    assert seen["after"] is None


def test_a_task_made_inside_a_scope_outlives_it() -> None:
    # the task's context was copied while the scope was open: it still names it
    qsl = layout()
    seen: dict[str, Any] = {}

    async def later(go: asyncio.Event) -> None:
        await go.wait()  # the scope that was open when the task was made is closed
        seen["active"] = stepcache.active_scope()
        g = Group(qsl, 5)
        g.lens()
        g.lens()  # its own store now
        with stepcache.scope() as scope:  # a scope of its own, not nested
            h, i = Group(qsl, 5), Group(qsl, 5)
            h.lens()
            i.lens()
            seen["inner"] = (stepcache.active_scope() is scope, h.calls + i.calls)
        seen["calls"] = g.calls

    async def main() -> None:
        go = asyncio.Event()
        with stepcache.scope():
            task = asyncio.ensure_future(later(go))
            await asyncio.sleep(0)
        go.set()
        await task

    asyncio.run(main())
    assert seen == {"active": None, "calls": ["lens"], "inner": (True, ["lens"])}


def test_checks_mode_reports_a_joined_owner_used_from_another_thread() -> None:
    qsl = layout()
    raised: list[BaseException] = []
    stepcache.clear_debug_report()
    with stepcache.debug("checks"), stepcache.scope():
        g = Group(qsl, 5)
        stepcache.cache_of(g)  # joins the scope (a call only reads its store)
        g.lens()

        def other() -> None:
            try:
                g.lens()
            except StaleCacheError as exc:
                raised.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert raised and "another thread" in str(raised[0])
    assert [d.kind for d in stepcache.debug_report()] == ["scope-thread"]
    stepcache.clear_debug_report()


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_mode_inside_a_scope_finds_a_broken_promise(mode: str) -> None:
    # checks compares a small CPU tensor's contents; verify computes again
    qsl = layout()
    stepcache.clear_debug_report()
    with stepcache.debug(mode), stepcache.scope():
        g = Group(qsl, 5)
        g.lens()
        with torch.inference_mode():
            qsl[1] = 1
        with pytest.raises(StaleCacheError, match="'query_start_loc' changed"):
            g.lens()
    stepcache.clear_debug_report()


def test_a_scope_is_entered_once() -> None:
    scope = stepcache.scope()
    with scope:
        pass
    with pytest.raises(StepCacheError, match="entered once"), scope:
        pass


def test_counts_inside_a_scope() -> None:
    stepcache.reset_stats()
    qsl = layout()
    with stepcache.scope():
        for _ in range(3):
            Group(qsl, 5).lens()
    row = stepcache.stats()["scope.lens"]
    assert (row.misses, row.hits, row.invalidations) == (1, 2, 0)
