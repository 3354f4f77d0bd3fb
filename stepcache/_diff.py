# SPDX-License-Identifier: Apache-2.0
"""Where two values first differ (`first_difference`), and short descriptions of
values for messages."""

from __future__ import annotations

import dataclasses
import types
from typing import Any

import numpy as np
import torch

from stepcache._kinds import plain_torch, strided, version

MISSING = object()  # what `getattr` gives for an attribute an object lacks


def describe(x: object) -> str:
    """A short description of a value, for messages."""
    if isinstance(x, torch.Tensor):
        state = "inference tensor" if x.is_inference() else f"version={version(x)}"
        shape = "nested" if x.is_nested else list(x.shape)
        text = f"tensor(shape={shape}, dtype={x.dtype}, device={x.device}, {state}"
        small = strided(x) and x.is_cpu and x.numel() <= 16
    elif isinstance(x, np.ndarray):
        text, small = f"ndarray(shape={list(x.shape)}, dtype={x.dtype}", x.size <= 16
    else:
        return r if len(r := repr(x)) <= 80 else r[:77] + "..."
    return f"{text}, id=0x{id(x):x}" + (f", values={x.tolist()}" if small else "") + ")"


def first_difference(
    expected: object,
    actual: object,
    path: str = "result",
    seen: frozenset[tuple[int, int]] = frozenset(),
) -> str | None:
    """Return where `actual` first differs from `expected`, or `None` if equal.

    The comparison verify mode makes between a cached value and a fresh one, and the
    vLLM plugin's parity mode between its value and stock vLLM's.

    Tensors are compared by device, dtype, layout, shape and values (NaN equals NaN);
    tuples, lists and dicts item by item; dataclass and attrs objects by the fields
    their `==` compares; objects that compare by identity attribute by attribute;
    anything else by type and `==`. `path` names the value in the message.

    Examples:
        >>> import stepcache, torch
        >>> stepcache.first_difference((1, torch.tensor([1, 2])), (1, torch.tensor([1, 3])))
        "tensor 'result[1]' value mismatch at flat index 1. expected 2, actual 3"
        >>> stepcache.first_difference([1.0], (1.0,))
        "'result': expected [1.0], actual (1.0,)"
        >>> stepcache.first_difference({"n": float("nan")}, {"n": float("nan")}) is None
        True
    """
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        with plain_torch():
            for what in ("device", "dtype", "layout", "is_nested", "ndim"):
                if (e := getattr(expected, what)) != (a := getattr(actual, what)):
                    return f"tensor '{path}' {what} mismatch. expected {e}, actual {a}"
            if expected.is_nested:  # compared component by component
                return first_difference(expected.unbind(), actual.unbind(), path, seen)
            for i, (n, m) in enumerate(zip(expected.shape, actual.shape, strict=True)):
                if n != m:
                    return f"tensor '{path}' size mismatch at index {i}. expected {n}, actual {m}"
            if expected.is_meta:  # no data: equal place and shape is all there is
                return None
            e, a = (t.detach().cpu().to_dense().reshape(-1) for t in (expected, actual))
            same = (e == a) | ((e != e) & (a != a))
            if bool(same.all()):
                return None
            i = int((~same).nonzero()[0])
            return f"tensor '{path}' value mismatch at flat index {i}. expected {e[i].item()}, actual {a[i].item()}"
    mismatch = f"'{path}': expected {describe(expected)}, actual {describe(actual)}"
    if type(expected) is not type(actual):
        return mismatch
    # ``actual``, of ``expected``'s class: read as it is (mypy cannot follow that test)
    got: Any = actual
    if isinstance(expected, dict) and expected.keys() != got.keys():
        keys = [sorted(map(repr, d)) for d in (expected, got)]
        return f"'{path}' keys mismatch. expected {keys[0]}, actual {keys[1]}"
    if isinstance(expected, (tuple, list, dict)):
        if (n := len(expected)) != (m := len(got)):
            return f"'{path}' length mismatch. expected {n}, actual {m}"
        for k in expected if isinstance(expected, dict) else range(n):
            if found := first_difference(expected[k], got[k], f"{path}[{k!r}]", seen):
                return found
        return None
    if (pair := (id(expected), id(actual))) in seen:  # a cycle: compared further up
        return None
    if (fields := _fields(expected)) is not None:  # field by field, as a tuple is
        if (other := _fields(actual)) is None or other.keys() != fields.keys():
            names = [sorted(f or ()) for f in (fields, other)]
            return f"'{path}' fields mismatch. expected {names[0]}, actual {names[1]}"
        for k, e in fields.items():
            if found := first_difference(e, other[k], f"{path}.{k}", seen | {pair}):
                return found
        return None
    try:
        if isinstance(expected, np.ndarray):
            nan = expected.dtype.kind in "fc"  # equal_nan raises for other dtypes
            return None if np.array_equal(expected, got, equal_nan=nan) else mismatch
        # NaN equals NaN, as above
        nans = isinstance(expected, float) and expected != expected and actual != actual
        return None if nans or bool(expected == actual) else mismatch
    except Exception:  # an == that does not give a bool
        return None if expected is actual else mismatch


def _fields(x: object) -> dict[str, object] | None:
    """The fields of a dataclass or attrs object, or the attributes of an object
    compared by identity (a fresh one never equals the cached one); else ``None``."""
    cls = type(x)
    if dataclasses.is_dataclass(x):  # the fields its == compares
        names = [f.name for f in dataclasses.fields(x) if f.compare]
    elif hasattr(cls, "__attrs_attrs__"):
        names = [a.name for a in cls.__attrs_attrs__ if a.eq]
    elif cls.__eq__ is object.__eq__ and isinstance(getattr(x, "__dict__", None), dict):
        # a class's __dict__ is a mappingproxy; a function or module is not data
        if callable(x) or isinstance(x, types.ModuleType):
            return None
        names = list(vars(x))
    else:
        return None
    return {n: getattr(x, n, MISSING) for n in names if n != "_stepcache"}
