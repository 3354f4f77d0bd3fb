# SPDX-License-Identifier: Apache-2.0
"""Owner kinds: plain classes, dataclasses (frozen, slotted), attrs classes (slotted)."""

from __future__ import annotations

import dataclasses
from typing import Any

import attrs
import pytest
import torch

import stepcache
from stepcache import StepCacheError, step_cached


def _build(self: Any) -> torch.Tensor:
    self.builds.append(1)
    return self.qsl * 2


cached = step_cached(depends_on=("qsl",), name="owners.build")(_build)
unbound = step_cached(name="owners.unbound")(_build)


class Plain:
    def __init__(self) -> None:
        self.qsl = torch.arange(4)
        self.builds: list[int] = []


@dataclasses.dataclass
class DC:
    qsl: torch.Tensor = dataclasses.field(default_factory=lambda: torch.arange(4))
    builds: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class Frozen:
    qsl: torch.Tensor = dataclasses.field(default_factory=lambda: torch.arange(4))
    builds: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True, weakref_slot=True)
class SlotsWithField:
    qsl: torch.Tensor = dataclasses.field(default_factory=lambda: torch.arange(4))
    builds: list[int] = dataclasses.field(default_factory=list)
    _stepcache: stepcache.StepCache | None = stepcache.dataclass_cache_field()


@attrs.define
class AttrsNoField:
    qsl: torch.Tensor = attrs.field(factory=lambda: torch.arange(4))
    builds: list[int] = attrs.field(factory=list)


@attrs.define
class AttrsWithField:
    qsl: torch.Tensor = attrs.field(factory=lambda: torch.arange(4))
    builds: list[int] = attrs.field(factory=list)
    _stepcache: stepcache.StepCache | None = stepcache.cache_field()


@attrs.frozen
class AttrsFrozenWithField:
    qsl: torch.Tensor = attrs.field(factory=lambda: torch.arange(4))
    builds: list[int] = attrs.field(factory=list)
    _stepcache: stepcache.StepCache | None = stepcache.cache_field()


OWNERS = [
    Plain,
    DC,
    Frozen,
    SlotsWithField,
    AttrsWithField,
    AttrsFrozenWithField,
]


@pytest.mark.parametrize("cls", OWNERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("fn", [cached, unbound], ids=["deps", "no-deps"])
def test_every_owner_kind_caches(cls: type, fn: Any) -> None:
    owner = cls()
    first = fn(owner)
    assert fn(owner) is first
    assert owner.builds == [1]
    assert torch.equal(first, torch.arange(4) * 2)
    assert len(stepcache.cache_of(owner)) == 1


@pytest.mark.parametrize("cls", [AttrsWithField, AttrsFrozenWithField, SlotsWithField])
def test_declared_field_stays_out_of_init_repr_and_eq(cls: type) -> None:
    a = cls()
    cached(a)
    assert "stepcache" not in repr(a)
    assert isinstance(a._stepcache, stepcache.StepCache)
    with pytest.raises(TypeError):
        cls(_stepcache=None)
    with pytest.raises(TypeError):
        cls(stepcache=None)


@pytest.mark.parametrize("fn", [cached, unbound], ids=["deps", "no-deps"])
def test_slotted_class_without_a_store_slot_gets_a_clear_error(fn: Any) -> None:
    """Its hits would all take the slow path: refused at the first call, naming the
    function, the owner parameter, the class and the slot to add."""
    with pytest.raises(StepCacheError) as raised:
        fn(AttrsNoField())
    text = str(raised.value)
    assert text.startswith(
        f"step_cached function '{fn.__stepcache__.name}': its owner parameter 'self'"
    )
    assert "AttrsNoField" in text and "add '_stepcache' to __slots__" in text


def test_slotted_class_without_weakref_support_gets_a_clear_error() -> None:
    @dataclasses.dataclass(slots=True)
    class NoWeak:
        qsl: torch.Tensor
        builds: list[int]
        _stepcache: stepcache.StepCache | None = stepcache.dataclass_cache_field()

    # an entry without dependencies is bound to its owner by a weak reference
    with pytest.raises(StepCacheError, match="weakref_slot=True"):
        unbound(NoWeak(torch.arange(4), []))
    owner = NoWeak(torch.arange(4), [])
    assert cached(owner) is cached(owner)  # one with dependencies needs none


@pytest.mark.parametrize("owner", [3, "text", (1, 2)], ids=["int", "str", "tuple"])
def test_a_builtin_owner_gets_an_error_naming_function_parameter_and_type(
    owner: object,
) -> None:
    @stepcache.step_cached(name="owners.builtin", owner="md")
    def value(md: object) -> int:
        return 1

    with pytest.raises(StepCacheError) as raised:
        value(owner)
    text = str(raised.value)
    assert text.startswith(
        "step_cached function 'owners.builtin': its owner parameter 'md' is a builtins."
    )
    assert type(owner).__name__ in text and "__weakref__" not in text


def test_side_table_entry_goes_with_its_owner() -> None:
    import gc
    import weakref

    @stepcache.step_cached(name="owners.tensor_side")
    def total(t: torch.Tensor) -> int:
        return int(t.sum())

    owner = torch.arange(4)  # a tensor keeps its store beside it, not in __dict__
    assert total(owner) == total(owner) == 6
    assert "_stepcache" not in vars(owner)
    store = weakref.ref(stepcache.cache_of(owner))
    assert store() is stepcache.cache_of(owner)
    del owner
    gc.collect()
    assert store() is None


def test_a_class_or_a_module_can_own_entries() -> None:
    import types

    builds: list[str] = []

    class Config:
        @classmethod
        @stepcache.step_cached()
        def table(cls) -> str:
            builds.append(cls.__name__)
            return cls.__name__.lower()

    # a class's namespace takes no new attributes: its store is in the side table
    assert Config.table() == Config.table() == "config"
    assert builds == ["Config"]
    assert stepcache.cache_of(Config) is stepcache.cache_of(Config)

    @stepcache.step_cached()
    def name_of(mod: types.ModuleType) -> str:
        builds.append(mod.__name__)
        return mod.__name__

    module = types.ModuleType("owner_module")
    assert name_of(module) == name_of(module) == "owner_module"
    assert builds == ["Config", "owner_module"]


def test_a_tensor_owner_caches_and_still_saves_as_a_plain_tensor() -> None:
    import io

    builds: list[int] = []

    @stepcache.step_cached(name="owners.tensor")
    def total(t: torch.Tensor) -> torch.Tensor:
        builds.append(1)
        return t.sum()

    t = torch.arange(4)
    assert total(t) is total(t) and builds == [1]
    saved = io.BytesIO()
    torch.save(t, saved)
    saved.seek(0)
    # nothing of stepcache in the file: a weights-only load (torch's default) takes it
    assert torch.load(saved, weights_only=True).tolist() == [0, 1, 2, 3]
    stepcache.cache_of(t).close()
    with pytest.raises(stepcache.StaleCacheError):
        total(t)


@pytest.mark.parametrize("cls", OWNERS)
def test_a_value_that_refers_to_its_owner_dies_with_it(cls: type) -> None:
    import gc
    import weakref

    @stepcache.step_cached(name="owners.cycle")
    def refers_back(owner: Any) -> list[Any]:
        return [owner]  # a cycle through the owner's store

    owner = cls()
    refers_back(owner)
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


def test_an_owner_whose_getattr_raises_keeps_its_store() -> None:
    class Lookup:
        __slots__ = ("__weakref__", "_stepcache", "d")

        def __init__(self) -> None:
            self.d: dict[str, int] = {}

        def __getattr__(self, name: str) -> int:
            return self.d[name]  # KeyError, not AttributeError

    builds: list[int] = []

    @stepcache.step_cached(name="owners.lookup")
    def value(owner: Lookup) -> int:
        builds.append(1)
        return 1

    owner = Lookup()
    assert value(owner) == value(owner) == 1 and builds == [1]
    stepcache.cache_of(owner).close()
    with pytest.raises(stepcache.StaleCacheError):
        value(owner)
