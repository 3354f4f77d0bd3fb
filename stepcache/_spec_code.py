# SPDX-License-Identifier: Apache-2.0
"""A spec's common case as one Python expression, for the generated hit and miss.

`TensorSpec.check` resolves every reference and normalises devices, about a
microsecond a miss. The generated code tests this expression first: it is true only
where the value plainly meets the spec (a tensor, same device object, the same dtype,
exact sizes), and every other case (a device given as a string, a reference that
resolves to ``None``, a wrong value) goes to the full check, which alone raises.
The expression may raise; the generated code takes that as "not sure" too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from stepcache._spec import Arg, Attr, Dim, Spec, TensorSpec

__all__ = ["predicate", "quick"]


def quick(
    expect: Spec, value: str, ref: Callable[[Arg | Attr], str], names: dict[str, Any]
) -> str:
    """An expression true only where ``value`` (an expression) meets ``expect``;
    ``ref`` gives the expression of a reference (an `Arg` or an `Attr`). The values
    it names are added to ``names`` (``_sc_q_`` names: globals of the code it joins)."""
    names.update(_sc_q_Tensor=torch.Tensor, _sc_q_int=int, _sc_q_tuple=tuple)

    def const(x: Any) -> str:
        name = f"_sc_q_{len(names)}"
        names[name] = x
        return name

    def one(spec: TensorSpec, v: str) -> str:
        parts = [f"{v}.__class__ is _sc_q_Tensor"]
        device = spec._device
        if isinstance(device, torch.device):
            # an unindexed accelerator device equals no tensor's: the full check
            parts.append(f"{v}.device == {const(device)}")
        elif device is not None:
            r = ref(device)
            parts.append(f"{r}.__class__ is _sc_q_Tensor and {v}.device == {r}.device")
        if isinstance(spec.dtype, torch.dtype):
            parts.append(f"{v}.dtype is {const(spec.dtype)}")
        elif spec.dtype is not None:
            r = ref(spec.dtype)
            parts.append(f"{r}.__class__ is _sc_q_Tensor and {v}.dtype is {r}.dtype")
        if spec.ndim is not None:
            parts.append(f"{v}.dim() == {spec.ndim}")
        for dims, op in ((spec.shape, "=="), (spec.min_shape, ">=")):
            if dims and (spec.ndim is None or spec.ndim < len(dims)):
                parts.append(f"{v}.dim() >= {len(dims)}")  # a skipped dim counts
            parts += [
                _dim(v, i, d, op, ref)
                for i, d in enumerate(dims or ())
                if d is not None
            ]
        return " and ".join(parts)

    if isinstance(expect, TensorSpec):
        text = one(expect, value)
    else:
        items = [one(s, f"{value}[{i}]") for i, s in enumerate(expect) if s is not None]
        text = " and ".join(
            [
                f"{value}.__class__ is _sc_q_tuple",
                f"len({value}) == {len(expect)}",
                *items,
            ]
        )
    return f"({text})"


def _dim(v: str, i: int, dim: Dim, op: str, ref: Callable[[Any], str]) -> str:
    if isinstance(dim, int):
        return f"{v}.shape[{i}] {op} {dim}"
    r = ref(dim)  # an int here; a tensor (its first dim), None, ...: the full check
    return f"{r}.__class__ is _sc_q_int and {v}.shape[{i}] {op} {r}"


def predicate(
    expect: Spec, index: Mapping[str, int], owner: int
) -> Callable[[Any, tuple[Any, ...]], bool]:
    """`quick` as a function of a value and a call's arguments ``a`` (by position:
    ``index`` maps a parameter's name to it, ``owner`` is the owner's), for the slow
    path; it may raise, as the expression may."""

    def ref(r: Arg | Attr) -> str:
        return f"a[{index[r.name]}]" if type(r) is Arg else f"a[{owner}].{r.name}"

    names: dict[str, Any] = {}
    text = quick(expect, "value", ref, names)
    made: Callable[[Any, tuple[Any, ...]], bool] = eval(  # noqa: S307
        f"lambda value, a: {text}", names
    )
    return made
