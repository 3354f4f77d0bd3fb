# SPDX-License-Identifier: Apache-2.0
"""A cached value (`Entry`), what it remembers of each input (its fingerprints) and
the one rule that says whether it still serves a call (:func:`match`,
`Entry.serves`).

A fingerprint is a pair ``(o, v)``: a tensor and its version counter; an inference
tensor (no version counter) and `ID` inside a scope, where its identity is the whole
promise, or outside one the tensor with its place (`placed`) and `PLACED`; a scalar
and `VAL`; a tuple of scalars and its snapshot (a `Typed`); a snapshot of a list,
dict or set of scalars and `SNAP`; any other object and `ID`. docs/concepts.md
("Dependencies and fingerprints") says what each one sees and misses.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch

from stepcache._errors import OwnerError
from stepcache._source import method

#: an input's ``v``, where it is not a tensor's version counter: compared by value and
#: type, by identity, by a snapshot of the contents, by where an inference tensor lies
VAL: Final = "VAL"
ID: Final = "ID"
SNAP: Final = "SNAP"
PLACED: Final = "PLACED"

Place = tuple[int, torch.Size, tuple[int, ...], torch.dtype, torch.device]


#: Where tensor ``{t}``'s data lies and how, as source text: what an inference
#: tensor's fingerprint outside a scope keeps. The generated miss inlines it
#: (`placed`), and `place` is compiled from it.
PLACE: Final = "({t}.data_ptr(), {t}.shape, {t}.stride(), {t}.dtype, {t}.device)"


def placed(t: str) -> str:
    """The fingerprint ``(o, PLACED)`` of inference tensor ``t`` (a name) outside a
    scope, as source text: ``o`` is the tensor and its place, a tuple, so that the
    hit's identity test leaves it to `match`. The one rule, which `fingerprints` runs
    and the generated miss inlines (prefix ``_sc_``)."""
    return f"(({t}, {PLACE.format(t=t)}), _sc_PLACED)"


#: the place of tensor ``t``: `PLACE`, run
place: Callable[[torch.Tensor], Place] = method(
    "<stepcache place>", "place(t)", [f"return {PLACE.format(t='t')}"], {}
)
#: the fingerprint of inference tensor ``x`` outside a scope: `placed`, run
_placed: Callable[[torch.Tensor], tuple[Any, str]] = method(
    "<stepcache placed>", "placed(x)", [f"return {placed('x')}"], {"_sc_PLACED": PLACED}
)


def strided(t: torch.Tensor) -> bool:
    """Whether ``t`` has a data pointer and strides (not sparse, nor nested)."""
    return t.layout is torch.strided and not t.is_nested


def tag(t: torch.Tensor) -> int | Place | str:
    """What identifies the state of tensor ``t``: its version counter, or, for an
    inference tensor (which has none), its :func:`place` (`ID` where it has no place:
    a sparse or nested inference tensor is matched by identity)."""
    if not t.is_inference():
        return t._version
    return place(t) if strided(t) else ID


class Typed:
    """A tuple's or frozenset's ``v``: its snapshot, which an equal new one must match
    (``x == o`` would take ``(1.0, 2.0)`` for ``(1, 2)``)."""

    __slots__ = ("snap",)

    def __init__(self, snap: Any) -> None:
        self.snap = snap

    def __repr__(self) -> str:
        return f"Typed({self.snap!r})"


#: exact classes compared by value (`_typed` also takes their subclasses)
VALUE_CLASSES: Final[frozenset[type]] = frozenset(
    {int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device}
)
_SCALARS = (*VALUE_CLASSES, enum.Enum, np.generic, slice)
_VALUE_TUPLES: Final = (tuple, frozenset)  # exact classes: a named tuple is an object
# read on every miss: a module global is one lookup, ``torch.Tensor`` two
_Tensor = torch.Tensor


def _typed(v: Any) -> Any:
    """``v`` with the class of each scalar in it, so that ``(1, 2)`` and ``(1.0, 2.0)``
    differ; ``None`` if it holds anything but scalars and tuples of them."""
    if isinstance(v, _SCALARS):
        return v.__class__, v
    if v.__class__ not in _VALUE_TUPLES:
        return None
    items = [_typed(i) for i in v]
    return None if None in items else (v.__class__, v.__class__(items))


def snapshot(x: Any) -> Any:
    """A comparable copy of a tuple, list, dict or set of scalars, each with its class
    (``None`` if it holds anything else)."""
    if isinstance(x, (list, bytearray)) or x.__class__ is tuple:
        items: Any = tuple(x)
    elif isinstance(x, (dict, set, frozenset)):
        items = tuple(x.items()) if isinstance(x, dict) else frozenset(x)
    else:
        return None
    typed = _typed(items)
    return None if typed is None else (type(x), typed)


def unsnapshot(snap: Any) -> Any:
    """The value a :func:`snapshot` was taken of (for messages).

    >>> unsnapshot(snapshot({"a": (1, 2.0)}))
    {'a': (1, 2.0)}
    """

    def plain(typed: Any) -> Any:  # (class, value), a tuple's items typed in turn
        cls, v = typed
        return cls(map(plain, v)) if cls in _VALUE_TUPLES else v

    return snap[0](plain(snap[1]))


def fingerprints(deps: Sequence[Any], scoped: bool = False) -> tuple[Any, ...]:
    """The fingerprints ``(o, v)`` of ``deps``, flat (``o0, v0, o1, v1, ...``), as an
    entry stores them (see the module doc); ``scoped``: taken for a scope's store,
    where an inference tensor is matched by identity. Taken before the computation: an
    input changed while it runs must not be recorded as the state it was computed from.

    >>> fingerprints((3, [1]))
    (3, 'VAL', (<class 'list'>, (<class 'tuple'>, ((<class 'int'>, 1),))), 'SNAP')
    """
    flat: list[Any] = []
    for x in deps:
        cls = x.__class__
        if cls is _Tensor and not x.is_inference():
            flat += (x, x._version)  # the common case first
        elif cls in VALUE_CLASSES:
            flat += (x, VAL)
        elif isinstance(x, _Tensor):
            if not x.is_inference():
                flat += (x, x._version)
            elif scoped:
                flat += (x, ID)
            else:
                try:
                    flat += _placed(x)
                except RuntimeError:  # sparse or nested: no place, its identity
                    flat += (x, ID)
        elif isinstance(x, _SCALARS):
            flat += (x, VAL)
        elif (snap := snapshot(x)) is not None:  # a tuple is kept: the same one hits
            flat += (x, Typed(snap)) if cls in _VALUE_TUPLES else (snap, SNAP)
        else:
            flat += (x, ID)
    return tuple(flat)


def fingerprint(x: Any, scoped: bool = False) -> tuple[Any, Any]:
    """The fingerprint ``(o, v)`` of one input."""
    o, v = fingerprints((x,), scoped)
    return o, v


#: The first test of :func:`match` as source text, which the generated hit inlines for
#: each dependency (``{x}``, ``{o}``, ``{v}``: names): the same object, with the same
#: version counter where it has one. Where it fails, `match` decides.
QUICK: Final = "{x} is {o} and ({v}.__class__ is not _sc_int or {x}._version == {v})"


def match(x: Any, o: Any, v: Any) -> bool:
    """Whether input ``x`` still matches the fingerprint ``(o, v)``: the one rule.

    The same object with the same version counter (:data:`QUICK`), or the same object
    where identity is all its fingerprint keeps; an inference tensor outside a scope,
    in the same place; an equal value of the same type; an equal snapshot.

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
    if x is o and (v.__class__ is not int or x._version == v):
        return True
    if v is VAL:
        return bool(x.__class__ is o.__class__ and x == o)
    if v is PLACED:
        return bool(x is o[0] and place(x) == o[1])
    if v is SNAP:
        return bool(snapshot(x) == o)
    return v.__class__ is Typed and snapshot(x) == v.snap


def walk(
    value: Any,
    leaf: Callable[[Any], Any],
    kinds: type | tuple[type, ...] = torch.Tensor,
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


def tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in ``value``, as `walk` finds them."""
    found: list[torch.Tensor] = []
    walk(value, found.append)
    return found


class _Tags:
    """The tags of several tensors (or of one inference tensor), read together as one
    ``_version``, so that a hit compares any result's guard as ``g._version == v``."""

    __slots__ = ("tensors",)

    def __init__(self, tensors: tuple[torch.Tensor, ...]) -> None:
        self.tensors = tensors

    @property
    def _version(self) -> tuple[int | Place | str, ...]:
        return tuple([tag(t) for t in self.tensors])


def result_guard(value: Any) -> tuple[Any, Any]:
    """``(g, v)``: ``g._version == v`` until a tensor of ``value`` is written in place.

    >>> a, b = torch.zeros(2), torch.zeros(2)
    >>> g, v = result_guard((a, [b]))
    >>> b.add_(1) is b, g._version == v
    (True, False)
    """
    if value.__class__ is _Tensor and not value.is_inference():
        return value, value._version  # the common case, without a walk
    found = tuple(tensors(value))
    if len(found) == 1 and not found[0].is_inference():
        return found[0], found[0]._version
    several = _Tags(found)
    return several, several._version


def no_weakref(owner: object) -> OwnerError:
    """The error for an owner without weak references, which an entry without
    dependencies (and a shared store) needs to tell it from other owners."""
    cls = type(owner)
    return OwnerError(
        f"is a {cls.__module__}.{cls.__qualname__}, which supports no weak "
        "references. Fix: give the class a __weakref__ slot "
        "(@dataclass(slots=True, weakref_slot=True); attrs classes have one)."
    )


def weak(owner: object) -> weakref.ref[Any]:
    """A weak reference to ``owner``, or the `OwnerError` that says how to allow one."""
    try:
        return weakref.ref(owner)
    except TypeError:
        raise no_weakref(owner) from None


def fill_entry(
    e: str, value: str, owner: str, deps: str, guard: str, info: str, args: str, p: str
) -> list[str]:
    """The lines that give new entry ``e`` its slots: the one rule, which
    `Entry.__init__` runs and the generated miss inlines. Each argument is a name or
    a literal (the compiler folds a literal ``False`` guard away); the names of
    `ENTRY_NAMES` are read with prefix ``p``."""
    return [
        f"{e}.value = {value}",
        f"{e}.deps = {deps}",
        f"{e}.info = {info}",
        f"{e}.args = {args}",
        # the bound rule: nothing else tells the owner's calls from another owner's
        f"{e}.bound = None if {deps} else {p}weak({owner})",
        f"if {guard}:",
        f"    {e}.guard, {e}.gtag = {p}result_guard({value})",
        "else:",
        f"    {e}.guard = {e}.gtag = None",
    ]


class Entry:
    """One cached value: ``value``; ``deps``, its dependencies' fingerprints, flat
    (``o0, v0, o1, v1, ...``); ``bound``, for an entry without dependencies, a weak
    reference to the owner that computed it, the only owner it serves (``None``
    otherwise); ``guard``/``gtag``, the result's guard (``guard_result``) or ``None``;
    ``info``, what debug mode recorded (or ``None``); ``args``, the arguments
    `expect` was checked against (``None``: it reads none).

    Its ``__init__`` is compiled from `fill_entry`, as attrs writes one from its
    fields: the generated miss makes entries with the same lines, without a call."""

    __slots__ = ("args", "bound", "deps", "gtag", "guard", "info", "value")
    value: Any
    deps: tuple[Any, ...]
    info: Any
    args: tuple[Any, ...] | None
    bound: Any
    guard: Any
    gtag: Any
    if TYPE_CHECKING:

        def __init__(
            self,
            value: Any,
            owner: object,
            deps: tuple[Any, ...],
            guard: bool,
            info: Any,
            args: tuple[Any, ...] | None = None,
        ) -> None: ...

    def serves(self, owner: object, xs: Sequence[Any]) -> bool:
        """Whether this entry serves a call on ``owner`` whose dependencies are ``xs``
        (what the generated hit tests inline)."""
        d = self.deps
        if xs:
            ok = all(match(x, d[2 * i], d[2 * i + 1]) for i, x in enumerate(xs))
        else:
            ok = self.bound is weakref.ref(owner)
        return ok and (self.guard is None or self.guard._version == self.gtag)

    @classmethod
    def absent(cls, deps: int) -> Entry:
        """What a lookup finds where there is no entry, for a function with ``deps``
        dependencies: it fails the hit's first test without raising."""
        entry = cls.__new__(cls)
        entry.value, entry.info, entry.guard, entry.gtag = None, None, None, None
        entry.args = None
        entry.bound = type(None)  # never an owner's weak reference
        entry.deps = (_NOTHING,) * (2 * deps)
        return entry


_NOTHING: Final = object()
#: the names `fill_entry`'s lines read (after their prefix)
ENTRY_NAMES: Final = {"weak": weak, "result_guard": result_guard}
Entry.__init__ = method(  # type: ignore[method-assign]
    "<stepcache Entry.__init__>",
    "__init__(self, value, owner, deps, guard, info, args=None)",
    fill_entry("self", "value", "owner", "deps", "guard", "info", "args", ""),
    ENTRY_NAMES,
)
