# SPDX-License-Identifier: Apache-2.0
"""`expect` against a model: a value passes exactly when every item the spec sets
holds, written out here item by item (references resolved by hand)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepcache import Arg, Attr, CacheValidationError, TensorSpec, step_cached

DTYPES = (torch.int32, torch.int64, torch.float32)


class Owner:
    def __init__(self, rows: int, dtype: torch.dtype) -> None:
        self.rows = rows
        self.dtype = dtype


dims = st.lists(st.sampled_from([None, 0, 1, 2, 3, Attr("rows")]), max_size=3)
specs = st.builds(
    TensorSpec,
    device=st.sampled_from([None, "cpu", torch.device("cpu"), Arg("like")]),
    dtype=st.sampled_from([None, *DTYPES, Attr("dtype"), Arg("like")]),
    ndim=st.sampled_from([None, 0, 1, 2, 3]),
    shape=st.none() | dims.map(tuple),
    min_shape=st.none() | dims.map(tuple),
)


def _want(item: Any, owner: Owner, like: torch.Tensor, attr: str) -> Any:
    if isinstance(item, Arg):
        return getattr(like, attr)
    if isinstance(item, Attr):
        value = getattr(owner, item.name)
        return value.shape[0] if isinstance(value, torch.Tensor) else value
    return item


def model(value: Any, spec: TensorSpec, owner: Owner, like: torch.Tensor) -> bool:
    """Whether ``value`` meets ``spec``, by the documented rules."""
    if not isinstance(value, torch.Tensor):
        return False
    device = spec.device
    if device is not None and value.device != torch.device(
        _want(device, owner, like, "device")
    ):
        return False
    if spec.dtype is not None and value.dtype != _want(
        spec.dtype, owner, like, "dtype"
    ):
        return False
    if spec.ndim is not None and value.dim() != spec.ndim:
        return False
    for wanted, least in ((spec.shape, False), (spec.min_shape, True)):
        if wanted is None:
            continue
        if len(wanted) > value.dim():
            return False
        for got, item in zip(value.shape, wanted, strict=False):
            want = _want(item, owner, like, "shape")
            if want is not None and (got < want if least else got != want):
                return False
    return True


def near(
    spec: TensorSpec, owner: Owner, like: torch.Tensor, data: st.DataObject
) -> Any:
    """A tensor built to meet ``spec`` (each dim at or just above its bound), often
    with one thing changed: the values where a check can be off by one."""
    n = spec.ndim
    if n is None:
        n = max(len(spec.shape or ()), len(spec.min_shape or ()))
    shape = [data.draw(st.integers(0, 3)) for _ in range(n)]
    for wanted, least in ((spec.shape, False), (spec.min_shape, True)):
        for i, item in enumerate(wanted or ()):
            want = _want(item, owner, like, "shape")
            if want is not None and i < n:
                shape[i] = want + (data.draw(st.integers(0, 1)) if least else 0)
    dtype = _want(spec.dtype, owner, like, "dtype") or torch.int64
    change = data.draw(st.sampled_from(["none", "dim", "ndim", "dtype", "type"]))
    if change == "dim" and shape:
        i = data.draw(st.integers(0, len(shape) - 1))
        shape[i] = max(0, shape[i] + data.draw(st.sampled_from([-1, 1])))
    if change == "ndim" and shape and data.draw(st.booleans()):
        shape.pop()
    elif change == "ndim":
        shape.append(1)
    if change == "dtype":
        dtype = data.draw(st.sampled_from(DTYPES))
    if change == "type":
        return data.draw(st.sampled_from([None, 0, [torch.zeros(1)]]))
    return torch.zeros(shape, dtype=dtype)


@settings(max_examples=400, deadline=None)
@given(specs, st.integers(1, 3), st.data())
def test_expect_passes_exactly_the_values_the_model_passes(
    spec: TensorSpec, n: int, data: st.DataObject
) -> None:
    owner = Owner(data.draw(st.integers(0, 3)), data.draw(st.sampled_from(DTYPES)))
    like = torch.zeros(2, dtype=data.draw(st.sampled_from(DTYPES)))
    items = [
        (near(spec, owner, like, data), data.draw(st.booleans())) for _ in range(n)
    ]
    # the spec alone, and the spec on each item of a tuple (None skips an item)
    tuple_spec = tuple(spec if checked else None for _, checked in items)
    cases: list[tuple[Any, Any, bool]] = [
        (items[0][0], spec, model(items[0][0], spec, owner, like)),
        (
            tuple(v for v, _ in items),
            tuple_spec,
            all(model(v, spec, owner, like) for v, c in items if c),
        ),
    ]
    for value, expect, ok in cases:

        @step_cached(
            expect=expect, owner="owner", ignore=("like", "made"), name="build"
        )
        def build(owner: Owner, like: torch.Tensor, made: Any = value) -> Any:
            return made

        try:
            result = build(owner, like)
        except CacheValidationError as exc:
            assert not ok, f"{spec!r} refused {value!r}: {exc}"
            assert str(exc).startswith("step_cached function 'build': ")
        else:
            assert ok, f"{spec!r} passed {value!r}"
            assert result is value
            # a hit with another caller's argument: what `expect` reads of it holds
            other = torch.zeros(
                data.draw(st.integers(0, 3)), dtype=data.draw(st.sampled_from(DTYPES))
            )
            values = value if isinstance(expect, tuple) else (value,)
            specs_ = expect if isinstance(expect, tuple) else (expect,)
            still = all(
                model(v, s, owner, other)
                for v, s in zip(values, specs_, strict=True)
                if s is not None
            )
            try:
                again = build(owner, other)
            except CacheValidationError:
                assert not still, f"{spec!r} refused {value!r} for {other!r}"
            else:
                assert still, f"{spec!r} passed {value!r} for {other!r}"
                assert again is value


def test_a_tuple_spec_refuses_a_value_of_another_length() -> None:
    @step_cached(expect=(TensorSpec(ndim=1), None))
    def pair(owner: object) -> Any:
        return (torch.zeros(2),)

    try:
        pair(Owner(1, torch.int32))
    except CacheValidationError as exc:
        assert "expected a tuple of 2 values, got a tuple of 1" in str(exc)
    else:
        raise AssertionError("a 1-tuple passed a spec of 2")
