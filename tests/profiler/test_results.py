# SPDX-License-Identifier: Apache-2.0
"""Results compare equal only when the profiler saw all of them: "equal results" must
mean interchangeable, or the suggested key leaves out an argument that matters."""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

import stepcache
from stepcache.profiler import ProfileReport


class Meta:
    pass


class Box:
    def __init__(self, v: int) -> None:
        self.kind = "box"
        self._v = v  # its state is private


class Slotted:
    __slots__ = ("__v", "kind")

    def __init__(self, v: int) -> None:
        self.kind = "slotted"
        self.__v = v


class Identity:
    def __init__(self, v: int) -> None:
        self.kind = "identity"

    def __eq__(self, other: object) -> bool:  # equal only to itself
        return self is other

    __hash__ = object.__hash__


def layer(meta: Meta, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(2, 2)  # different weights per seed


def boxed(meta: Meta, v: int) -> Box:
    return Box(v)


def slotted(meta: Meta, v: int) -> Slotted:
    return Slotted(v)


def identity(meta: Meta, v: int) -> Identity:
    return Identity(v)


class Partial(functools.partial):  # type: ignore[type-arg]
    """A heap type made in C: its state (func, args) is no attribute."""


def partial_of(meta: Meta, v: int) -> Partial:
    made = Partial(print, v)
    made.tag = "same"  # type: ignore[attr-defined]
    return made


def boxed_same(meta: Meta, v: int) -> Box:
    return Box(0)


def run(names: list[str], values: list[int]) -> ProfileReport:
    with stepcache.profile([f"{__name__}:{n}" for n in names]) as report:
        for _ in range(2):
            meta = Meta()
            for v in values:
                for n in names:
                    fn: Any = globals()[n]
                    fn(meta, v)
            report.step()
    return report


def test_results_with_hidden_state_are_not_equal() -> None:
    names = ["layer", "boxed", "slotted", "identity", "partial_of"]
    report = run(names, [0, 1, 2])
    for name in names:
        row = report[name]
        assert (row.identical, row.redundant, row.suggestion) == (0, 0, None), name


def test_private_attributes_are_compared() -> None:
    report = run(["boxed_same", "boxed"], [0, 1, 0])
    same = report["boxed_same"].suggestion
    assert same is not None and same.ignored == ("v",)  # equal results whatever v
    s = report["boxed"].suggestion
    assert s is not None and s.key == ("v",)  # the third call repeats the first
    assert report["boxed"].redundant == 2


def full(v: float) -> torch.Tensor:
    return torch.full((4,), v)


def passes_on(v: float) -> torch.Tensor:
    return full(v)  # the same tensor, handed up through two wrapped calls


def test_results_the_program_drops_are_freed() -> None:
    with stepcache.profile([f"{__name__}:full", f"{__name__}:passes_on"]) as report:
        refs = [weakref.ref(passes_on(float(v))) for v in (1, 2, 1)]
        assert [r() for r in refs] == [None, None, None]  # the profiler kept none
        kept = [passes_on(1.0), full(2.0)]  # results still alive
    assert kept[1].sum() == 8
    # full(1.0) three times, full(2.0) twice: the later ones of each are equal results
    assert (report["full"].calls, report["full"].redundant) == (5, 3)
    assert report["passes_on"].redundant == 2


def loss(meta: Meta, scale: float) -> float:
    return scale * float("nan")


def test_nan_results_and_arguments_are_equal_to_themselves() -> None:
    with stepcache.profile(f"{__name__}:loss") as report:
        for _ in range(2):
            meta = Meta()
            loss(meta, float("nan")), loss(meta, float("nan")), loss(meta, 1.0)
            loss(meta, 2.0)
            report.step()
    row = report["loss"]
    assert (row.identical, row.impure, row.redundant) == (2, 0, 6)
    assert row.suggestion is not None and row.suggestion.ignored == ("scale",)
