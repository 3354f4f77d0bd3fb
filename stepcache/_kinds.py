# SPDX-License-Identifier: Apache-2.0
"""The serving rule, once: the kinds of input a cached value depends on, how each is
fingerprinted when the value is stored, and how a later input is tested against that
fingerprint.

A fingerprint is a pair ``(o, v)``. ``v`` names the kind: a tensor's version counter
(an ``int``), or one of the `Kind` objects of the table below (`ID`, `VAL`,
`PLACED`, `TUPLE`, `SNAP`), whose `Kind.test` decides.
Every reader of the rule derives from this module: the generated hit inlines `QUICK`
(the same object, with the same version counter where it has one) and calls `match`
where it fails; the slow path and debug mode call `match`. docs/concepts.md
("Dependencies and fingerprints") says what each kind sees and misses.
"""

from __future__ import annotations

import enum
import operator
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Final

import numpy as np
import torch

Place = tuple[int, torch.Size, tuple[int, ...], torch.dtype, torch.device]
#: a fingerprint ``(o, v)``: what was stored, and a version counter (an ``int``) or
#: its `Kind` (typed ``object``: only `match` reads it, by its class)
Print = tuple[object, object]
#: a value with its class, as `_typed` keeps it (a tuple's items each typed in turn)
Typed = tuple[type, object]
#: what `snapshot` takes of a tuple, list, dict or set: its class and its items, typed
Snapshot = tuple[type, Typed]


class Kind:
    """One kind of input that is not a tensor with a version counter: its name (in
    messages and docs) and its test of a new input ``x`` against the stored ``o``."""

    __slots__ = ("name", "test")

    # each of ``x`` and ``o`` is read as the kind knows it (``o[0]``, a tensor's
    # `place`), so both stay `Any`
    def __init__(self, name: str, test: Callable[[Any, Any], bool]) -> None:
        self.name, self.test = name, test

    def __repr__(self) -> str:
        return self.name


#: tensor ``t``'s version counter, ``version(t)``: what every in-place torch op moves
#: on (torch names it privately only, and types it nowhere)
version: Callable[[torch.Tensor], int] = operator.attrgetter("_version")


#: a block in which torch calls skip tensor subclasses' ``__torch_function__`` (debug
#: mode's guarded views); torch names it privately only
plain_torch: Callable[[], AbstractContextManager[None]] = (
    torch._C.DisableTorchFunctionSubclass  # noqa: SLF001
)


def place(t: torch.Tensor) -> Place:
    """Where tensor ``t``'s data lies and how: what an inference tensor (which has no
    version counter) is matched by outside a scope."""
    return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device


def strided(t: torch.Tensor) -> bool:
    """Whether ``t`` has a data pointer and strides (not sparse, nor nested)."""
    return t.layout is torch.strided and not t.is_nested


def tag(t: torch.Tensor) -> int | Place | str:
    """What identifies the state of tensor ``t``: its version counter, or for an
    inference tensor its `place` (``"ID"`` where it has none)."""
    if not t.is_inference():
        return version(t)
    return place(t) if strided(t) else "ID"


#: exact classes compared by value (`_typed` also takes their subclasses)
VALUE_CLASSES: Final[frozenset[type]] = frozenset(
    {int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device}
)
_SCALARS = (*VALUE_CLASSES, enum.Enum, np.generic, slice)
_VALUE_TUPLES: Final = (tuple, frozenset)  # exact classes: a named tuple is an object


def _typed(v: object) -> Typed | None:
    """``v`` with the class of each scalar in it, so that ``(1, 2)`` and ``(1.0, 2.0)``
    differ; ``None`` if it holds anything but scalars and tuples of them."""
    if isinstance(v, _SCALARS):
        return v.__class__, v
    if v.__class__ not in _VALUE_TUPLES:
        return None
    items = [_typed(i) for i in v]
    return None if None in items else (v.__class__, v.__class__(items))


def snapshot(x: object) -> Snapshot | None:
    """A comparable copy of a tuple, list, dict or set of scalars, each with its class
    (``None`` if it holds anything else)."""
    if isinstance(x, (list, bytearray)) or x.__class__ is tuple:
        typed = _typed(tuple(x))
    elif isinstance(x, (dict, set, frozenset)):
        typed = _typed(tuple(x.items()) if isinstance(x, dict) else frozenset(x))
    else:
        return None
    return None if typed is None else (type(x), typed)


def unsnapshot(snap: Snapshot) -> object:
    """The value a :func:`snapshot` was taken of (for messages).

    >>> unsnapshot(snapshot({"a": (1, 2.0)}))
    {'a': (1, 2.0)}
    """

    # a value with its class (a tuple's items typed in turn), read as its class says
    def plain(cls: type, v: Any) -> object:
        return cls(plain(*i) for i in v) if cls in _VALUE_TUPLES else v

    return snap[0](plain(*snap[1]))


# The table. A tensor with a version counter has no row: its ``v`` is the counter.
#: any object kept by identity; an inference tensor inside a scope (the scope's promise)
ID: Final = Kind("ID", lambda x, o: x is o)
#: a scalar: an equal value of the same class
VAL: Final = Kind("VAL", lambda x, o: x.__class__ is o.__class__ and x == o)
#: an inference tensor outside a scope: ``o`` is (the tensor, its `place`)
PLACED: Final = Kind("PLACED", lambda x, o: x is o[0] and place(x) == o[1])
#: a tuple or frozenset of scalars: ``o`` is (it, its snapshot), the same one or equal
TUPLE: Final = Kind("TUPLE", lambda x, o: x is o[0] or snapshot(x) == o[1])
#: a list, dict or set of scalars: ``o`` is its snapshot when it was stored
SNAP: Final = Kind("SNAP", lambda x, o: snapshot(x) == o)

#: `match`'s first test as source text, which the generated hit inlines for each
#: dependency (``{x}``, ``{o}``, ``{v}``: names): exact for a tensor with a version
#: counter and for `ID`, enough for `VAL`; where it fails, `match` decides.
QUICK: Final = "{x} is {o} and ({v}.__class__ is not _sc_int or {x}._version == {v})"


def match(x: Any, o: Any, v: Any) -> bool:
    """Whether input ``x`` still matches the fingerprint ``(o, v)``: the one rule.

    >>> t = torch.zeros(2)
    >>> o, v = fingerprint(t)
    >>> match(t, o, v), t.add_(1) is t, match(t, o, v)
    (True, True, False)
    >>> with torch.inference_mode():
    ...     i = torch.zeros(2)
    >>> o, v = fingerprint(i)
    >>> match(i, o, v), match(i.clone(), o, v)
    (True, False)
    >>> match(1000 + 1, *fingerprint(1001)), match(1.0, *fingerprint(1))
    (True, False)
    """
    # Any: each is read as ``v``'s class says (an int: ``x is o``, a tensor; else ``v``
    # is a Kind), which no isinstance narrows on this hot path
    if v.__class__ is int:
        return x is o and version(x) == v
    return bool(v.test(x, o))


def fingerprint(x: object, scoped: bool = False) -> Print:
    """The fingerprint ``(o, v)`` of input ``x``, taken before the value is computed
    (an input changed while it runs must not be recorded as its state); ``scoped``:
    for a scope's store, where an inference tensor is matched by identity.

    >>> fingerprint(3), fingerprint([1])
    ((3, VAL), ((<class 'list'>, (<class 'tuple'>, ((<class 'int'>, 1),))), SNAP))
    """
    cls = x.__class__
    if cls in VALUE_CLASSES:
        return x, VAL
    if isinstance(x, torch.Tensor):
        return inference_fingerprint(x, scoped) if x.is_inference() else (x, version(x))
    if isinstance(x, _SCALARS):
        return x, VAL
    if (snap := snapshot(x)) is None:
        return x, ID
    return ((x, snap), TUPLE) if cls in _VALUE_TUPLES else (snap, SNAP)


def inference_fingerprint(t: torch.Tensor, scoped: bool) -> Print:
    """`fingerprint` of an inference tensor (the generated miss calls it)."""
    try:
        return (t, ID) if scoped else ((t, place(t)), PLACED)
    except RuntimeError:  # sparse or nested: no place, its identity
        return t, ID
