# SPDX-License-Identifier: Apache-2.0
"""``only=``: calls whose arguments are outside the given collections bypass the cache."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import StepCacheError

CACHED = frozenset({"swa_only", "c128a"})


class Step:
    pass


_names = itertools.count()


def _counting() -> tuple[Any, list[tuple[str, int]]]:
    """A fresh builder (its stats row is its name) and the builds it makes."""
    builds: list[tuple[str, int]] = []

    @stepcache.step_cached(
        key=("kind", "rows"),
        only={"kind": CACHED},
        ignore=("layer",),
        name=f"only.sparse.{next(_names)}",
    )
    def sparse(step: Step, kind: str, rows: int, layer: int) -> tuple[str, int, int]:
        builds.append((kind, rows))
        return (kind, rows, layer)

    return sparse, builds


@settings(max_examples=200, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["swa_only", "c128a", "c4a", "other"]), st.integers(0, 2)
        ),
        max_size=30,
    )
)
def test_each_cached_key_builds_once_and_every_other_call_builds(
    calls: list[tuple[str, int]],
) -> None:
    sparse, builds = _counting()
    step = Step()
    for layer, (kind, rows) in enumerate(calls):
        value = sparse(step, kind, rows, layer)
        assert value[:2] == (kind, rows)
        if kind not in CACHED:
            assert value[2] == layer  # computed for this very call
    outside = sum(kind not in CACHED for kind, _ in calls)
    inside = {(k, r) for k, r in calls if k in CACHED}
    assert len(builds) == outside + len(inside)
    label = sparse.__stepcache__.name  # type: ignore[attr-defined]
    row = stepcache.cache_of(step).stats().get(label)
    assert (row["misses"] if row else 0) == len(inside)
    assert stepcache.stats(include_idle=True)[label].bypasses == outside


def test_only_works_without_a_key_and_in_debug_and_disabled_modes() -> None:
    calls = []

    @stepcache.step_cached(only={"mode": {"fast"}}, ignore=("mode",))
    def value(step: Step, mode: str) -> str:
        calls.append(mode)
        return mode.upper()

    step = Step()
    assert value(step, "fast") == value(step, "fast") == "FAST"
    assert value(step, "slow") == value(step, "slow") == "SLOW"
    assert calls == ["fast", "slow", "slow"]
    with stepcache.debug("verify"):  # a hit recomputes once to compare
        assert value(step, "fast") == "FAST"
        assert value(step, "slow") == "SLOW"
    assert calls == ["fast", "slow", "slow", "fast", "slow"]
    with stepcache.disabled():
        assert value(step, "fast") == "FAST"
    assert calls[-1] == "fast" and len(calls) == 6


def test_an_unhashable_argument_is_a_typed_error() -> None:
    sparse, _ = _counting()
    with pytest.raises(StepCacheError, match="only= test raised TypeError"):
        sparse(Step(), ["c128a"], 1, 0)


def test_a_cached_kind_with_an_unhashable_key_part_is_a_typed_error() -> None:
    # the kind passes only=; the key (kind, rows) cannot be hashed, on a new owner and
    # on one whose store has entries
    sparse, builds = _counting()
    step = Step()
    with pytest.raises(StepCacheError, match="unhashable"):
        sparse(step, "c128a", [1], 0)
    sparse(step, "c128a", 1, 0)
    with pytest.raises(StepCacheError, match="unhashable"):
        sparse(step, "swa_only", [1], 0)
    assert builds == [("c128a", 1)]


def test_a_second_kind_a_copy_and_a_closed_store_miss_as_they_should() -> None:
    # an only= function looks its key up with get() (see stepcache._hit): a key its store
    # does not hold, a copy's foreign store and a closed store all reach the miss
    import copy

    sparse, builds = _counting()
    step = Step()
    first = sparse(step, "swa_only", 1, 0)
    assert sparse(step, "c128a", 1, 1) == ("c128a", 1, 1)
    assert sparse(step, "swa_only", 1, 2) is first
    assert builds == [("swa_only", 1), ("c128a", 1)]
    twin = copy.copy(step)  # shares the original's store attribute
    assert sparse(twin, "swa_only", 1, 3) == ("swa_only", 1, 3)  # its own entry
    assert sparse(step, "swa_only", 1, 4) is first
    assert len(builds) == 3
    stepcache.cache_of(step).close()
    with pytest.raises(stepcache.StaleCacheError):
        sparse(step, "swa_only", 1, 5)


@pytest.mark.parametrize(
    ("only", "message"),
    [
        ({"nope": CACHED}, "only= names 'nope', which is not a parameter"),
        ({"step": CACHED}, "only= names 'step', which is not a parameter besides"),
        ({"kind": "c128a"}, "must be a collection of the values to cache"),
        ({"kind": 3}, "must be a collection of the values to cache"),
        (["kind"], "only= takes a mapping"),
    ],
)
def test_a_malformed_only_is_refused_at_decoration(only: Any, message: str) -> None:
    with pytest.raises(StepCacheError, match=message):

        @stepcache.step_cached(key="kind", only=only)
        def f(step: Step, kind: str) -> str:
            return kind
