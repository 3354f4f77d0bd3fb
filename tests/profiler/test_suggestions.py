# SPDX-License-Identifier: Apache-2.0
"""The suggested owner, key, BYPASS and depends_on, and the decorator line: applied to
the function, it serves the calls the profiler counted and changes no result."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache.profiler import ProfileReport

from . import sample

MOD = sample.__name__


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    with stepcache.profile(MOD, step_by="step") as report:
        sample.run([[1, 2], [3, 1, 1], [2], [1, 1]])
    return report


def test_owner_is_the_step_object_not_the_builder(report: ProfileReport) -> None:
    s = report["Builder.build"].suggestion
    assert s is not None
    # Two builders build the same thing from the step: 'self' does not matter.
    assert (s.owner, s.key, s.ignored) == ("step", (), ("self",))
    assert set(s.depends_on) == {"query_lens", "num_tokens"}
    assert s.decorator == (
        "@stepcache.step_cached(owner=\"step\", depends_on=('num_tokens', 'query_lens'), "
        "ignore=('self',))"
    )


def test_bypass_for_values_whose_results_differ(report: ProfileReport) -> None:
    s = report["Builder.layer"].suggestion
    assert s is not None
    assert (s.owner, s.key, s.bypass, s.ignored) == (
        "step",
        ("kind",),
        ("kind", ("wide",)),
        ("number",),
    )
    assert s.depends_on == ("num_tokens",)
    assert any("BYPASS" in n for n in s.notes)


def test_redundant_counts(report: ProfileReport) -> None:
    # four steps, and the first make_step call before any step object exists
    assert report.steps == 5
    assert report["Builder.build"].redundant == 4  # the second builder, each step
    assert report["Builder.layer"].redundant == 4  # the second narrow layer
    # index is called inside build: its redundant calls are covered by build's
    index = report["Builder.index"]
    assert index.redundant == 4 and index.covered_ns == index.redundant_ns
    assert index.inside is not None and index.inside.endswith("Builder.build")
    ranked = [r.name.rpartition(":")[2] for r in report.redundant]
    assert set(ranked[:2]) == {"Builder.build", "Builder.layer"}
    assert ranked[2] == "Builder.index"


def test_hidden_inputs_are_reported() -> None:
    step = sample.make_step([1])
    with stepcache.profile(f"{MOD}:noisy") as report:
        for _ in range(3):
            sample.noisy(step)
    row = report["noisy"]
    assert (row.identical, row.impure, row.redundant) == (2, 2, 0)
    assert row.suggestion is None


def rows_of(step: sample.Step) -> Iterator[int]:
    """A generator: each call hands out a fresh iterator over the step's rows."""
    yield from range(step.num_tokens)


def opaque(step: sample.Step) -> object:
    """A result the profiler cannot digest (nothing to compare)."""
    return object()


def test_a_generator_function_gets_no_suggestion() -> None:
    step = sample.make_step([1, 2])
    with stepcache.profile(f"{__name__}:rows_of") as report:
        for _ in range(3):
            assert list(rows_of(step)) == list(range(step.num_tokens))
    row = report["rows_of"]
    assert row.identical == 2 and row.suggestion is None  # a cached one is used up


def test_results_it_cannot_digest_are_not_called_impure() -> None:
    step = sample.make_step([1])
    with stepcache.profile(f"{__name__}:opaque") as report:
        for _ in range(3):
            opaque(step)
    assert (report["opaque"].identical, report["opaque"].impure) == (2, 0)


@stepcache.step_cached(depends_on=("num_tokens",))
def cached_rows(step: sample.Step) -> int:
    return step.num_tokens


def _logged(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)
    def wrapper(*args: Any) -> Any:
        return f(*args)

    return wrapper


@_logged
@stepcache.step_cached(depends_on=("num_tokens",))
def logged_rows(step: sample.Step) -> int:
    return step.num_tokens


@pytest.mark.parametrize("name", ["cached_rows", "logged_rows"])
def test_a_step_cached_function_is_not_suggested_again(name: str) -> None:
    with stepcache.profile(f"{__name__}:{name}") as report:
        fn: Any = globals()[name]  # the profiled one
        assert fn.__stepcache__ is not None  # still visible while profiled
        for lens in ([1], [2]):
            step = sample.make_step(lens)
            fn(step), fn(step), fn(step)
            report.step()
    row = report[name]
    assert (row.identical, row.redundant, row.suggestion) == (4, 0, None)
    assert any("already @stepcache.step_cached" in note for note in row.notes)
    assert "already @stepcache.step_cached" in report.table()


def _apply(line: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    assert line.startswith("@stepcache.step_cached(")
    decorator = eval(line[1:], {"stepcache": stepcache})
    return decorator(fn)  # type: ignore[no-any-return]


def test_the_suggested_decorator_serves_the_layers(report: ProfileReport) -> None:
    line = report["Builder.layer"].suggestion.decorator  # type: ignore[union-attr]
    assert line is not None
    Cached = type(
        "Cached", (sample.Builder,), {"layer": _apply(line, sample.Builder.layer)}
    )
    plain, cached = sample.Builder(), Cached()
    kinds = ("narrow", "narrow", "wide", "wide")
    for lens in ([1, 2], [3]):
        step = sample.make_step(lens)
        before = sample.calls["layer"]
        got = [cached.layer(step, k, i) for i, k in enumerate(kinds)]
        assert sample.calls["layer"] - before == 3  # the second narrow layer is a hit
        want = [plain.layer(step, k, i) for i, k in enumerate(kinds)]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


# -- for all call sequences: the suggested cache changes no result ---------------------------
RULES: dict[str, Callable[[int, int], int]] = {
    "a": lambda a, b: a,
    "a+b": lambda a, b: a + b,
    "const": lambda a, b: 7,
    "a if b else -1": lambda a, b: a if b else -1,
    "b odd: a": lambda a, b: a * 10 + (b if b % 2 else 0),
}
RULE = ["a"]


def pick(step: sample.Step, a: int, b: int) -> int:
    """A per-step computation whose result depends on some of its arguments."""
    return RULES[RULE[0]](a, b)


calls = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 3)), min_size=1, max_size=8
)


@settings(max_examples=60, deadline=None)
@given(
    rule=st.sampled_from(sorted(RULES)), steps=st.lists(calls, min_size=2, max_size=3)
)
def test_suggestions_never_change_results(
    rule: str, steps: list[list[tuple[int, int]]]
) -> None:
    RULE[0] = rule
    with stepcache.profile(pick, step_by="step") as report:
        for step_calls in steps:
            step = sample.make_step([1])
            for a, b in step_calls:
                pick(step, a, b)
    row = report["pick"]
    assert row.calls == sum(map(len, steps))
    if row.suggestion is None:
        assert row.redundant == 0
        return
    assert row.suggestion.owner == "step"
    assert row.suggestion.decorator is not None
    cached = _apply(row.suggestion.decorator, pick)
    computed_before = 0
    served = 0
    for step_calls in steps:
        step = sample.make_step([1])
        for a, b in step_calls:
            assert cached(step, a, b) == pick(step, a, b)
    stats = stepcache.stats().get("pick")
    if stats is not None:
        served = stats.hits
        computed_before = stats.misses + stats.bypasses
    # The cache serves exactly the calls the profiler called redundant.
    assert served == row.redundant
    assert computed_before == row.calls - row.redundant
    stepcache.reset_stats()
