# SPDX-License-Identifier: Apache-2.0
"""A step's first call on a new metadata object raises no exception inside stepcache
(a caught exception is costly with cold CPU caches): the owner's class holds a
placeholder store, and the entry dicts answer a missing function or key with an entry
that fails every check. The placeholders never hold an entry, and classes that keep
their stores elsewhere are left alone."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Callable
from types import FrameType
from typing import Any

import attrs
import pytest
import torch

import stepcache
from stepcache import step_cached
from stepcache._store import NO_STORE


def _make_class() -> type:
    """A fresh class each time: the placeholder is set on a class's first store."""

    class Meta:
        def __init__(self, n: int) -> None:
            self.qsl = torch.tensor([0, n])
            self.n = n

        @step_cached(depends_on=("qsl", "n"))
        def index(self) -> torch.Tensor:
            return torch.zeros(self.n, dtype=torch.int32)

        @step_cached(depends_on=("qsl",))
        def other(self) -> int:
            return int(self.qsl[-1])

        @step_cached(key="k")
        def keyed(self, k: int) -> int:
            return k + self.n

        @step_cached(key="k", depends_on=("qsl",))
        def keyed_deps(self, k: int) -> int:
            return k * int(self.qsl[-1])

        @step_cached()
        def plain(self) -> int:
            return self.n

    return Meta


def _raised_in_stepcache(call: Callable[[], Any]) -> list[str]:
    """Names of the generated functions in which an exception was raised during
    ``call()``."""
    raised: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.startswith("<stepcache"):
            if event == "exception":
                raised.append(frame.f_code.co_name)
            return tracer
        return None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(old)
    return raised


@pytest.mark.parametrize("first", ["index", "other", "keyed", "keyed_deps", "plain"])
def test_first_calls_on_new_owners_raise_nothing_inside(first: str) -> None:
    meta = _make_class()
    meta(0).plain()  # the class's first store sets its placeholder
    assert meta.__dict__["_stepcache"] is NO_STORE
    for n in (1, 3, 7):
        m = meta(n)
        args = (9,) if first.startswith("keyed") else ()
        call = functools.partial(getattr(m, first), *args)
        assert _raised_in_stepcache(call) == []  # no store yet
        # functions with dependencies: a store, with or without an entry for them
        assert _raised_in_stepcache(m.index) == []
        assert _raised_in_stepcache(m.other) == []
        # hits
        for again in (m.index, m.other, call):
            assert _raised_in_stepcache(again) == []
        want = getattr(meta(n), first)(*args)
        assert torch.equal(torch.as_tensor(call()), torch.as_tensor(want))


def test_no_first_call_raises_inside_on_an_own_store_or_in_a_scope() -> None:
    # a function with no table yet in a store, a new key, a scope's first call: each
    # a lookup that finds nothing, not a caught exception
    meta = _make_class()
    m = meta(2)
    m.index()  # m has a store of its own now
    assert _raised_in_stepcache(lambda: m.keyed(1)) == []  # no table in it yet
    assert _raised_in_stepcache(lambda: m.keyed(2)) == []  # a table, not this key
    assert _raised_in_stepcache(m.plain) == []
    assert (m.keyed(1), m.keyed(2), m.plain()) == (3, 4, 2)
    assert _raised_in_stepcache(lambda: m.keyed(1)) == []
    with stepcache.scope():  # the first calls of a build, in the scope's store
        s = meta(2)
        assert _raised_in_stepcache(lambda: s.keyed(1)) == []
        assert _raised_in_stepcache(s.plain) == []
        assert _raised_in_stepcache(s.index) == []


def test_new_keys_on_a_store_that_has_one_compute_once_each() -> None:
    # what that KeyError means: a miss, computed and counted as any other
    meta = _make_class()
    m = meta(2)
    m.index()  # a store of its own
    keyed, plain = (f"{meta.__qualname__}.{f}" for f in ("keyed", "plain"))
    hits = stepcache.stats()[keyed].hits if keyed in stepcache.stats() else 0
    assert [m.keyed(k) for k in (1, 2, 3, 1, 2, 3)] == [3, 4, 5, 3, 4, 5]
    assert m.plain() == m.plain() == 2
    stats = stepcache.cache_of(m).stats()
    assert [stats[n]["misses"] for n in (keyed, plain)] == [3, 1]
    assert [stats[n]["entries"] for n in (keyed, plain)] == [3, 1]
    assert stepcache.stats()[keyed].hits == hits + 3


def test_an_owner_holding_something_else_as_its_store_is_served_right() -> None:
    # an attribute named like the store, holding an object with a table: not a
    # store, so the slow path decides (here: the value, every time)
    meta = _make_class()

    class Odd(meta):  # type: ignore[misc,valid-type]
        def __init__(self, n: int) -> None:
            super().__init__(n)
            self._stepcache = types.SimpleNamespace(table={})

    odd = Odd(2)
    assert [odd.keyed(1), odd.keyed(1), odd.plain(), odd.plain()] == [3, 3, 2, 2]


def test_the_placeholders_never_hold_an_entry() -> None:
    meta = _make_class()
    owners = [meta(n) for n in (1, 2, 3)]
    for m in owners:
        m.index()
        m.keyed(1)
        m.qsl = torch.tensor([0, m.n])
        m.index()
        m.keyed(2)
    # each owner holds its own entries; a new owner of the class holds none
    assert all(len(stepcache.cache_of(m)) == 3 for m in owners)
    assert len(stepcache.cache_of(meta(4))) == 0


def test_a_fresh_owner_of_a_placed_class_gets_a_store_of_its_own() -> None:
    meta = _make_class()
    first, second = meta(1), meta(2)
    first.index()
    assert "_stepcache" not in vars(second)
    store = stepcache.cache_of(second)
    assert isinstance(store, stepcache.StepCache) and store is not NO_STORE
    assert vars(second)["_stepcache"] is store
    assert stepcache.cache_of(first) is not store


def test_a_frozen_dataclass_gets_the_placeholder() -> None:
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        n: int

        @step_cached(key="k")
        def f(self, k: int) -> int:
            return self.n + k

    Frozen(0).f(0)
    assert Frozen.__dict__["_stepcache"] is NO_STORE
    m = Frozen(4)
    assert _raised_in_stepcache(lambda: m.f(1)) == []
    assert m.f(1) == 5 and dataclasses.replace(m, n=6).f(1) == 7


def test_classes_that_keep_their_stores_elsewhere_are_left_alone() -> None:
    @attrs.define
    class WithField:
        n: int
        _stepcache: stepcache.StepCache | None = stepcache.cache_field()

        @step_cached()
        def f(self) -> int:
            return self.n

    class Declared:
        _stepcache = None  # the class's own attribute, not stepcache's placeholder

        def __init__(self, n: int) -> None:
            self.n = n

        @step_cached()
        def f(self) -> int:
            return self.n

    for cls in (WithField, Declared):
        for n in (1, 2):
            m = cls(n)
            assert m.f() == n and m.f() == n
            assert (
                stepcache.cache_of(m).stats()[cls.f.__stepcache__.name]["misses"] == 1
            )
    assert vars(WithField).get("_stepcache") is not NO_STORE
    assert Declared.__dict__["_stepcache"] is None


def test_an_owner_whose_class_refuses_class_attributes_still_works() -> None:
    class Strict(type):
        def __setattr__(cls, name: str, value: Any) -> None:
            raise AttributeError(f"{cls.__name__} is closed to new attributes")

    class Owner(metaclass=Strict):
        def __init__(self, n: int) -> None:
            self.n = n

        @step_cached(key="k")
        def f(self, k: int) -> int:
            return self.n * k

    for n in (1, 2, 3):
        m = Owner(n)
        assert m.f(2) == 2 * n and m.f(2) == 2 * n
    assert "_stepcache" not in vars(Owner)


def test_a_first_call_keeps_its_store_past_the_owners_own_setattr() -> None:
    writes: list[str] = []

    class Logged:
        def __init__(self, n: int) -> None:
            object.__setattr__(self, "n", n)

        def __setattr__(self, name: str, value: Any) -> None:
            writes.append(name)
            object.__setattr__(self, name, value)

        @step_cached(depends_on=("n",))
        def f(self) -> int:
            return self.n * 2

    Logged(0).f()  # the class's first store sets its placeholder
    owners = [Logged(n) for n in (1, 2, 3)]
    assert [m.f() for m in owners] == [2, 4, 6] == [m.f() for m in owners]
    assert writes == []  # as a frozen dataclass's: its __setattr__ is not called
    for m in owners:
        assert stepcache.cache_of(m).stats()[Logged.f.__stepcache__.name]["misses"] == 1
