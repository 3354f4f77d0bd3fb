# SPDX-License-Identifier: Apache-2.0
"""A cached value (`Entry`): what it was computed from, whom it serves, and the
guard on its tensors."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from stepcache._errors import OwnerError
from stepcache._kinds import Place, match, tag, version

_Tensor = torch.Tensor


def walk(
    value: Any, leaf: Callable[[Any], Any], kinds: type | tuple[type, ...] = _Tensor
) -> Any:
    """``value`` with ``leaf(x)`` in place of each ``x`` of ``kinds`` (tensors by
    default): the value itself, or inside plain tuples, named tuples, lists and dicts
    (other containers are left as they are). The one walk through a cached value.

    >>> walk((torch.tensor([1]), [torch.tensor([2])], "x"), lambda t: t.tolist())
    ([1], [[2]], 'x')
    """
    if isinstance(value, kinds):
        return leaf(value)
    cls = value.__class__
    if cls is tuple or cls is list:
        return cls([walk(v, leaf, kinds) for v in value])
    if cls is dict:
        return {k: walk(v, leaf, kinds) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(cls, "_fields"):  # a named tuple
        return cls(*[walk(v, leaf, kinds) for v in value])
    return value


def tensors(value: object) -> list[torch.Tensor]:
    """Every tensor in ``value``, as `walk` finds them."""
    found: list[torch.Tensor] = []
    walk(value, found.append)
    return found


class _Tags(tuple[torch.Tensor, ...]):
    """Several tensors (or one inference tensor), whose tags are read together as one
    ``_version``, so that a hit compares any result's guard as ``g._version == v``."""

    __slots__ = ()

    @property
    def _version(self) -> tuple[int | Place | str, ...]:
        return tuple([tag(t) for t in self])


def result_guard(value: Any) -> tuple[Any, Any]:
    """``(g, v)``: ``g._version == v`` until a tensor of ``value`` is written in place.

    >>> a, b = torch.zeros(2), torch.zeros(2)
    >>> g, v = result_guard((a, [b]))
    >>> b.add_(1) is b, g._version == v
    (True, False)
    """
    if value.__class__ is _Tensor and not value.is_inference():
        return value, version(value)  # the common case, without a walk
    found = tensors(value)
    if len(found) == 1 and not found[0].is_inference():
        return found[0], version(found[0])
    several = _Tags(found)
    return several, several._version  # noqa: SLF001 (what a hit reads)


def weak(
    owner: object, callback: Callable[[weakref.ref[object]], object] | None = None
) -> weakref.ref[object]:
    """A weak reference to ``owner`` (``callback``: called as it dies), or the
    `OwnerError` that says how to allow one: an entry without dependencies (and a
    shared store) needs one to tell its owner from other owners."""
    try:
        return weakref.ref(owner, callback)
    except TypeError:
        cls = type(owner)
        raise OwnerError(
            f"is a {cls.__module__}.{cls.__qualname__}, which supports no weak "
            "references. Fix: give the class a __weakref__ slot "
            "(@dataclass(slots=True, weakref_slot=True); attrs classes have one)."
        ) from None


class Entry:
    """One cached value: ``value``; ``deps``, its dependencies' fingerprints, flat
    (``o0, v0, o1, v1, ...``: `stepcache._kinds`); ``bound``, for an entry without
    dependencies, a weak reference to the owner that computed it, the only owner it
    serves (``None`` otherwise); ``guard``/``gtag``, the result's guard
    (``guard_result``) or ``None``; ``info``, what debug mode recorded (or ``None``);
    ``args``, the arguments `expect` was checked against (``None``: it reads none)."""

    __slots__ = ("args", "bound", "deps", "gtag", "guard", "info", "value")

    def __init__(
        self,
        value: object,
        owner: object,
        deps: tuple[object, ...],
        guard: bool = False,
        info: Any = None,
        args: tuple[object, ...] | None = None,
    ) -> None:
        # one write per statement: no tuple built (a miss's cost)
        self.value = value
        self.deps = deps
        self.info = info
        self.args = args
        # nothing else tells the owner's calls from another owner's of its store
        self.bound: weakref.ref[object] | None = None if deps else weak(owner)
        self.guard = self.gtag = None  # the result's guard, where guard_result
        if guard:
            self.guard, self.gtag = result_guard(value)

    def serves(self, owner: object, xs: Sequence[object]) -> bool:
        """Whether this entry serves a call on ``owner`` whose dependencies are ``xs``:
        the rule the generated hit inlines."""
        # each input against its fingerprint (``deps``: o0, v0, o1, v1, ...); no
        # dependencies: an entry bound to the owner that computed it
        d = self.deps
        ok = all(map(match, xs, d[::2], d[1::2])) if xs else self.owner() is owner
        return ok and (self.guard is None or version(self.guard) == self.gtag)

    def owner(self) -> object:
        """The owner a bound entry serves (``None``: any, or it is gone)."""
        return None if self.bound is None else self.bound()
