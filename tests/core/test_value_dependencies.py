# SPDX-License-Identifier: Apache-2.0
"""Tuples, lists, dicts and sets as dependencies: compared item by item, each item with
its type (an equal value of another type recomputes, as a scalar's does), in every
mode; one that comes to hold a tensor recomputes instead of comparing it with ``==``.
Parameters named like the builtins the generated hit uses do not change it."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import stepcache
from stepcache import StepCacheError, step_cached

MODES = ["off", "checks", "verify"]


class Meta:
    def __init__(self, lens: Any) -> None:
        self.lens = lens

    @step_cached(depends_on=("lens",), name="values.dtype")
    def dtype(self) -> torch.dtype:
        return torch.tensor(self.lens).dtype

    @step_cached(depends_on=("lens",), name="values.text")
    def text(self) -> str:
        return str(self.lens)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("before", "after"),
    [
        ((1, 2), (1.0, 2.0)),
        ((True, False), (1, 0)),
        (frozenset({1}), frozenset({True})),
    ],
)
def test_an_equal_tuple_of_other_item_types_recomputes(
    mode: str, before: Any, after: Any
) -> None:
    with stepcache.debug(mode):
        md = Meta(before)
        first = md.text()
        md.lens = after
        assert md.text() == str(after) != first
    assert stepcache.stats()["values.text"].misses == 2


@pytest.mark.parametrize("mode", MODES)
def test_a_list_written_with_equal_values_of_another_type_recomputes(mode: str) -> None:
    with stepcache.debug(mode):
        md = Meta([1, 2])
        assert md.dtype() == torch.int64
        md.lens[0], md.lens[1] = 1.0, 2.0
        assert md.dtype() == torch.float32


@pytest.mark.parametrize("mode", MODES)
def test_an_equal_tuple_that_is_another_object_still_hits(mode: str) -> None:
    with stepcache.debug(mode):
        md = Meta((1, 2))
        md.dtype()
        md.lens = tuple([1, 2])
        md.dtype()
    assert stepcache.stats()["values.dtype"].misses == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("item", [torch.tensor(1), torch.tensor([1, 1])])
def test_a_tuple_that_comes_to_hold_a_tensor_recomputes(
    mode: str, item: torch.Tensor
) -> None:
    with stepcache.debug(mode):
        md = Meta((1, 2))
        md.text()
        md.lens = (item, 2)
        assert md.text() == str((item, 2))
        assert md.text() == str((item, 2))


def test_parameters_named_like_builtins_keep_the_version_check() -> None:
    class Lens:
        def __init__(self) -> None:
            with torch.inference_mode(False):  # a tensor with a version counter
                self.lens = torch.tensor([1, 2])

        @step_cached(key="int", depends_on=("lens",), ignore=("Exception", "tuple"))
        def total(self, int: int = 0, Exception: Any = None, tuple: Any = None) -> Any:  # noqa: A002
            return int + self.lens.sum().item()

    md = Lens()
    assert md.total() == 3
    md.lens.add_(10)
    assert (md.total(), md.total(1, Exception=2), md.total(1)) == (23, 24, 24)


@pytest.mark.parametrize("name", ["class", "None", "lambda"])
def test_a_keyword_as_a_dependency_is_a_typed_error(name: str) -> None:
    with pytest.raises(StepCacheError, match=f"depends_on takes attribute .*'{name}'"):
        step_cached(depends_on=(name,))(lambda self: 1)
