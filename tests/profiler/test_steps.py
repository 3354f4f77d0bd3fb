# SPDX-License-Identifier: Apache-2.0
"""What a step is, and which calls count as identical: tensors by identity and
version, scalars by value, defaults and keywords bound to parameters."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache

from . import sample

MOD = sample.__name__


def test_report_step_marks_steps() -> None:
    t = torch.tensor([1, 2])
    with stepcache.profile(f"{MOD}:total") as report:
        sample.total(t)
        sample.total(t)
        report.step()
        sample.total(t)  # the same tensor, but a new step: not a repeat
    row = report["total"]
    assert (report.steps, row.calls, row.identical, row.max_calls_per_step) == (
        2,
        3,
        1,
        2,
    )


def test_without_steps_the_block_is_one_step() -> None:
    t = torch.tensor([1, 2])
    with stepcache.profile(f"{MOD}:total") as report:
        for _ in range(4):
            sample.total(t)
    assert (report.steps, report["total"].identical) == (1, 3)
    assert any("one step observed" in n for n in report["total"].suggestion.notes)  # type: ignore[union-attr]


def test_tensors_compare_by_identity_and_version() -> None:
    t = torch.tensor([1, 2])
    with stepcache.profile(f"{MOD}:total") as report:
        sample.total(t)
        sample.total(t.clone())  # equal values, another tensor: not identical
        t.add_(0)  # bumps the version
        sample.total(t)
        sample.total(t)  # identical to the previous call
    row = report["total"]
    assert row.identical == 1
    # All four returned 3, but a cache owned by the tensor serves only the repeat.
    assert row.redundant == 1
    assert row.suggestion is not None and row.suggestion.owner == "query_lens"


def test_scalars_compare_by_value_and_type_and_bind_to_parameters() -> None:
    t = torch.tensor([1, 2])
    with stepcache.profile(f"{MOD}:scaled", results=False) as report:
        sample.scaled(t)
        sample.scaled(t, 1)  # the default, given
        sample.scaled(t, factor=1, offset=0)  # by keyword
        sample.scaled(query_lens=t)
        sample.scaled(t, 2)
        sample.scaled(t, 1.0)  # type: ignore[arg-type]  # a float is not the int 1
    assert report["scaled"].identical == 3


def test_step_function() -> None:
    with stepcache.profile(f"{MOD}:Builder.build", step=f"{MOD}:run") as report:
        sample.run([[1, 2], [3]])  # one call of run: one step
        sample.run([[2]])
    row = report["Builder.build"]
    assert report.steps == 2
    assert (row.calls, row.steps, row.max_calls_per_step) == (6, 2, 4)


def test_step_by_parameter() -> None:
    with stepcache.profile(MOD, step_by="step") as report:
        sample.run([[1, 2], [3], [4, 4]])
    build = report["Builder.build"]
    # make_step runs before the step object exists: its calls join the current step
    assert report.steps == 4
    assert (build.calls, build.steps, build.calls_per_step) == (6, 3, 2.0)


def test_steps_outside_the_step_function_are_not_counted() -> None:
    with stepcache.profile(MOD, step=f"{MOD}:Builder.build") as report:
        sample.run([[1, 2], [3]])
    assert (
        report.steps == 4
    )  # the four build calls; the layers between them group apart


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(0, 3), st.just("step")),
        max_size=30,
    )
)
def test_identical_calls_are_calls_minus_distinct_arguments_per_step(
    script: list[int | str],
) -> None:
    """For any sequence of calls and step marks: identical = sum over steps of
    (calls - distinct arguments); and the wrapped function returns what it did."""
    tensors = [torch.tensor([i, 1]) for i in range(4)]
    expected_identical = 0
    seen: set[int] = set()
    results = []
    with stepcache.profile(f"{MOD}:total") as report:
        for op in script:
            if op == "step":
                report.step()
                seen = set()
                continue
            assert isinstance(op, int)
            expected_identical += op in seen
            seen.add(op)
            results.append(sample.total(tensors[op]))
    assert results == [int(tensors[op].sum()) for op in script if isinstance(op, int)]
    calls = sum(op != "step" for op in script)
    if calls:
        row = report["total"]
        assert (row.calls, row.identical) == (calls, expected_identical)
        assert row.redundant >= row.identical
    else:
        assert len(report) == 0


class Meta:
    pass


def plan(meta: Meta, nxt: Meta) -> int:
    prepare(nxt)  # the next step's object: a new step begins inside this call
    return 1


def prepare(meta: Meta) -> int:
    return 2


def test_calls_that_span_a_step_change_are_counted() -> None:
    with stepcache.profile(
        [f"{__name__}:plan", f"{__name__}:prepare"], step_by="meta"
    ) as report:
        metas = [Meta() for _ in range(3)]
        for a, b in zip(metas, metas[1:], strict=False):
            plan(a, b), plan(a, b)
    row = report["plan"]
    assert (row.calls, row.across_steps, row.redundant) == (4, 4, 0)
    assert any("spanned a step change" in note for note in row.notes)
    assert report["prepare"].across_steps == 0
