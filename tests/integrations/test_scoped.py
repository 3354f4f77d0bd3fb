# SPDX-License-Identifier: Apache-2.0
"""The scope the patch kit puts around an engine's build (`scoped`): written for the
build's own signature, it passes every argument on as the caller gave it, opens a
scope unless the call says not to, counts, and looks like the build it wraps."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import stepcache
from stepcache.integrations.patching import SkipPatch, counters, scoped


def build(
    groups: list[int],
    /,
    num_reqs: int,
    max_query_len: int = 1,
    *extra: Any,
    for_cudagraph_capture: bool = False,
    tag: str = "t",
    **more: Any,
) -> dict[str, Any]:
    """An engine's build, with a parameter of every kind."""
    return {
        "groups": groups,
        "num_reqs": num_reqs,
        "max_query_len": max_query_len,
        "extra": extra,
        "capture": for_cudagraph_capture,
        "tag": tag,
        "more": more,
        "scope": stepcache.active_scope(),
    }


def _wrapped(name: str) -> Any:
    return scoped(
        build, name, unless="for_cudagraph_capture", at_most_one="max_query_len"
    )


def _counts(name: str) -> dict[str, int]:
    return counters.to_dict([name]).get(name, {})


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (([1, 2], 3), {}),
        (([1], 3, 4, "x", "y"), {"tag": "u", "z": 5}),
        (([],), {"num_reqs": 0, "max_query_len": 9, "for_cudagraph_capture": False}),
        (([1], 2), {"max_query_len": 4, "for_cudagraph_capture": True, "k": None}),
    ],
)
def test_every_argument_reaches_the_build_as_given(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    wrapped = _wrapped("test.scoped.args")
    got, want = wrapped(*args, **kwargs), build(*args, **kwargs)
    assert {k: v for k, v in got.items() if k != "scope"} == {
        k: v for k, v in want.items() if k != "scope"
    }


def test_it_opens_a_scope_unless_the_call_captures_or_decodes_only() -> None:
    name = "test.scoped.when"
    wrapped = _wrapped(name)
    counters.reset([name])
    assert wrapped([1], 2, 4)["scope"] is not None  # a prefill: a scope
    assert stepcache.active_scope() is None  # closed after the build
    assert wrapped([1], 2, max_query_len=1)["scope"] is None  # decodes only
    assert wrapped([1], 2)["scope"] is None  # the default is 1
    assert wrapped([1], 2, 4, for_cudagraph_capture=True)["scope"] is None
    assert wrapped([1], 2, 4.0)["scope"] is not None  # not an int: a scope
    assert _counts(name) == {"scopes": 2, "unscoped": 3}


def test_an_exception_in_the_build_closes_its_scope() -> None:
    def failing(max_query_len: int) -> None:
        assert stepcache.active_scope() is not None
        raise ValueError(max_query_len)

    wrapped = scoped(failing, "test.scoped.raises", at_most_one="max_query_len")
    with pytest.raises(ValueError, match="7"):
        wrapped(7)
    assert stepcache.active_scope() is None


def test_it_looks_like_the_build() -> None:
    wrapped = _wrapped("test.scoped.looks")
    assert wrapped.__name__ == "build" and wrapped.__doc__ == build.__doc__
    assert inspect.signature(wrapped) == inspect.signature(build)


def test_a_parameter_it_does_not_have_or_named_like_its_own_globals_is_skipped() -> (
    None
):
    with pytest.raises(SkipPatch, match="no parameter 'longest'"):
        scoped(build, "test.scoped.missing", at_most_one="longest")

    def odd(_sc_original: int, max_query_len: int) -> int:
        return _sc_original

    with pytest.raises(SkipPatch, match="_sc_"):
        scoped(odd, "test.scoped.odd", at_most_one="max_query_len")
