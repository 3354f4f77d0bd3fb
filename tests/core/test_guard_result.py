# SPDX-License-Identifier: Apache-2.0
"""guard_result: a cached view into a persistent buffer is recomputed, not returned
stale, once another build wrote the buffer."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

import stepcache
from stepcache import StepCacheError, step_cached


@dataclasses.dataclass
class Step:
    lens: tuple[int, ...]
    builds: int = 0


def _index(md: Step, buffer: torch.Tensor) -> torch.Tensor:
    md.builds += 1
    idx = torch.repeat_interleave(
        torch.arange(len(md.lens), dtype=torch.int32), torch.tensor(md.lens)
    )
    buffer[: idx.numel()].copy_(idx)
    return buffer[: idx.numel()]


guarded = step_cached(
    ignore=("buffer",), owner="md", depends_on=("lens",), guard_result=True
)(_index)
unguarded = step_cached(ignore=("buffer",), owner="md", depends_on=("lens",))(_index)
guarded_pair = step_cached(
    ignore=("a", "b"), owner="md", guard_result=True, name="guarded_pair"
)(lambda md, a, b: (a[:2], b[:2], "tag"))


Persistent = Callable[[torch.Tensor], torch.Tensor]


def _overwrite(fn: object, persistent: Persistent) -> tuple[Step, torch.Tensor]:
    # a persistent buffer, allocated outside the step (outside inference mode)
    buffer = persistent(torch.zeros(16, dtype=torch.int32))
    first = Step((3, 2, 2))
    fn(first, buffer)  # type: ignore[operator]
    fn(Step((1, 1, 1)), buffer)  # another layout, same persistent buffer
    return first, buffer


def test_without_the_guard_the_old_owner_gets_the_new_rows(
    persistent: Persistent,
) -> None:
    first, buffer = _overwrite(unguarded, persistent)
    assert unguarded(first, buffer).tolist() == [0, 1, 2, 1, 1, 2, 2]  # stale


def test_with_the_guard_the_old_owner_recomputes(persistent: Persistent) -> None:
    first, buffer = _overwrite(guarded, persistent)
    assert guarded(first, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert first.builds == 2
    row = stepcache.stats()[guarded.__qualname__]
    assert row.invalidations == 1 and row.misses == 3


def test_the_guard_lets_untouched_values_hit() -> None:
    md = Step((2, 2))
    buffer = torch.zeros(8, dtype=torch.int32)
    a = guarded(md, buffer)
    assert guarded(md, buffer) is a and md.builds == 1


def test_every_tensor_of_a_tuple_is_guarded(persistent: Persistent) -> None:
    md = Step(())
    a, b = persistent(torch.zeros(4)), persistent(torch.ones(4))
    first = guarded_pair(md, a, b)
    assert guarded_pair(md, a, b) is first
    b.add_(1)  # the second tensor's storage changes
    again = guarded_pair(md, a, b)
    assert again is not first and again[1].tolist() == [2.0, 2.0]


def test_the_guard_holds_in_checks_mode(persistent: Persistent) -> None:
    with stepcache.debug("checks"):
        first, buffer = _overwrite(guarded, persistent)
        assert guarded(first, buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]


def test_guard_result_must_be_a_bool() -> None:
    with pytest.raises(StepCacheError, match="guard_result must be True or False"):
        step_cached(guard_result="yes")(_index)  # type: ignore[arg-type]


def test_an_inference_result_is_guarded_by_its_place_and_shape(step_mode: str) -> None:
    # a result made in the step, without a version counter: a write into it is not
    # seen in production, but a result that is no longer the same view is
    md = Step((1,))
    with torch.inference_mode():
        a, b = torch.zeros(4), torch.ones(4)
    first = guarded_pair(md, a, b)
    assert guarded_pair(md, a, b) is first
    with torch.inference_mode():
        b.add_(1)  # no counter to bump: served as it is, written
        assert guarded_pair(md, a, b) is first
        b.resize_(8)
    again = guarded_pair(md, a, b)
    assert again is not first and again[1].shape == (2,)
