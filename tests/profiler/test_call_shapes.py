# SPDX-License-Identifier: Apache-2.0
"""Calls of one function with different shapes (arity, keywords, no signature) are
analysed consistently, and the report always comes out."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import pytest

import stepcache


def double(a: int) -> int:
    return a * 2


def test_a_call_that_does_not_bind_is_not_analysed() -> None:
    with stepcache.profile(f"{__name__}:double") as report:
        for _ in range(2):
            double(1), double(1)
            with pytest.raises(TypeError):
                double(1, 2)  # type: ignore[call-arg]
            report.step()
    row = report["double"]
    assert (row.calls, row.errors, row.identical, row.redundant) == (6, 2, 2, 2)
    assert "double" in report.table()


def test_a_function_without_signature_called_with_one_and_two_args() -> None:
    with stepcache.profile("math:log") as report:
        for _ in range(2):
            math.log(8.0), math.log(8.0, 2), math.log(8.0, 2)
            report.step()
    row = report["log"]
    assert (row.calls, row.identical, row.redundant) == (6, 2, 2)
    assert "math:log" in report.table()


def _takes_anything(f: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(f)  # the signature shown is f's, the one called is not
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return f(args[0])

    return wrapper


@_takes_anything
def first(a: int) -> int:
    return a


def test_calls_that_do_not_bind_but_return_are_counted_apart() -> None:
    with stepcache.profile(f"{__name__}:first") as report:
        first(1), first(1, 2), first(1)
    row = report["first"]
    assert (row.calls, row.unbound, row.identical) == (3, 1, 1)
    assert any("do not bind" in note for note in row.notes)
    assert "do not bind" in report.table()
    assert report.to_dict()["functions"][0]["unbound"] == 1


def make(**fields: int) -> list[str]:
    return sorted(fields)


def test_keyword_names_under_var_keyword_count() -> None:
    with stepcache.profile(f"{__name__}:make") as report:
        for _ in range(2):
            make(x=1), make(y=1), make(x=1)
            report.step()
    row = report["make"]
    assert (row.identical, row.impure, row.redundant) == (2, 0, 2)
