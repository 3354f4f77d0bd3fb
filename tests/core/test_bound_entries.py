# SPDX-License-Identifier: Apache-2.0
"""Entries without dependencies are bound to the object that computed them: in its own
store, in a store shared on purpose (attach), in the side table, and for a copy."""

from __future__ import annotations

import copy

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import StepCacheError, step_cached


class Meta:
    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.runs = 0

    @step_cached(key="k", name="bound.tagged")
    def tagged(self, k: int) -> tuple[str, int]:
        self.runs += 1
        return (self.tag, k)

    @step_cached(name="bound.mine")
    def mine(self) -> str:
        self.runs += 1
        return self.tag

    @step_cached(key="k", name="bound.keyed_list")
    def keyed(self, k: object) -> object:
        self.runs += 1
        return k


@attrs.define(slots=True, weakref_slot=True)
class Slotted:
    """A slotted class with a store slot."""

    tag: str
    runs: int = 0
    _stepcache: stepcache.StepCache | None = stepcache.cache_field()

    @step_cached(key="k", name="bound.slotted_tagged")
    def tagged(self, k: int) -> tuple[str, int]:
        self.runs += 1
        return (self.tag, k)


def _owners(kind: str) -> list[Meta]:
    a, b = Meta("a"), Meta("b")
    if kind == "attached":
        stepcache.attach(b, stepcache.cache_of(a))
    return [a, b]


CALLS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 2), st.booleans()), max_size=30
)


@settings(max_examples=100, deadline=None)
@given(kind=st.sampled_from(["separate", "attached", "copied"]), calls=CALLS)
def test_every_caller_gets_its_own_value(
    kind: str, calls: list[tuple[int, int, bool]]
) -> None:
    owners = _owners(kind)
    if kind == "copied":
        owners[0].tagged(0)
        owners[0].mine()
        twin = copy.copy(owners[0])  # carries owners[0]'s store attribute
        twin.tag = "twin"
        owners[1] = twin
    slotted = [Slotted("s0"), Slotted("s1")]
    for who, k, plain in calls:
        if who == 2:
            assert slotted[k % 2].tagged(k) == (f"s{k % 2}", k)
            continue
        owner = owners[who]
        if plain:
            assert owner.mine() == owner.tag
        else:
            assert owner.tagged(k) == (owner.tag, k)


def test_a_shared_store_keeps_each_owners_entry_bound_to_it() -> None:
    a, b = _owners("attached")
    assert a.tagged(1) == ("a", 1)
    assert b.tagged(1) == ("b", 1)  # a's entry is bound to a: b computes its own
    assert a.tagged(1) == ("a", 1)
    assert b.mine() == "b" and a.mine() == "a"


def test_an_unhashable_key_on_an_existing_store_is_a_typed_error() -> None:
    md = Meta("a")
    assert md.mine() == "a"  # the store exists, with no slot for `keyed` yet
    runs = md.runs
    with pytest.raises(StepCacheError, match=r"bound\.keyed_list.*unhashable"):
        md.keyed([1, 2])
    assert md.runs == runs  # raised before the function ran
    md.keyed(3)
    with pytest.raises(StepCacheError, match="unhashable"):
        md.keyed([1, 2])  # and with the slot there
    assert md.runs == runs + 1
