# SPDX-License-Identifier: Apache-2.0
"""Argument fingerprints (identity for tensors and objects) and result digests
(contents), as the profiler compares calls.

An argument fingerprint is what a cache key could see at call time: a tensor is the
same object at the same in-place version, a scalar is an equal value of the same type,
a small tuple or list is its items, any other object is itself (its identity). A
result digest is what the call produced: tensor and array contents, values, and every
attribute of small objects; two results with equal digests are interchangeable, so an
object with state the digest cannot see (an ``nn.Module``, a C base, its own
``__eq__``) has no digest.

>>> import torch
>>> t = torch.zeros(3)
>>> keep: dict[int, object] = {}
>>> argprint(t, keep) == argprint(t, keep)
True
>>> before = argprint(t, keep); _ = t.add_(1); argprint(t, keep) == before
False
>>> digest(torch.ones(2)) == digest(torch.ones(2)), digest(1) == digest(True)
(True, False)
"""

from __future__ import annotations

import enum
import struct
import weakref
from collections.abc import Hashable
from types import FunctionType, ModuleType
from typing import Any, Final

import numpy as np
import torch

from stepcache._kinds import plain_torch, tag
from stepcache._kinds import version as counter

__all__ = [
    "KIND_OBJECT",
    "KIND_TENSOR",
    "KIND_VALUE",
    "Memo",
    "argprint",
    "digest",
    "fieldprint",
    "kind_of",
]

#: How an argument is compared (see :func:`kind_of`).
KIND_VALUE: Final = "value"
KIND_TENSOR: Final = "tensor"
KIND_OBJECT: Final = "object"

_VALUES: Final = frozenset(
    {int, float, bool, str, bytes, complex, type(None), torch.dtype, torch.device}
)
_SEQ_MAX: Final = 8
_SMALL_ARRAY: Final = 256
#: results larger than this are not digested (they compare as "unknown")
DIGEST_MAX_BYTES: Final = 16 << 20
_DEPTH: Final = 3
_FIELDS_MAX: Final = 64


#: what a NaN (float or complex) is fingerprinted as: NaN is not equal to itself, but
#: two calls that both got or returned NaN got or returned the same thing
NAN: Final = "nan"


def kind_of(x: Any) -> str:
    """``value`` (compared by value), ``tensor`` (identity and version) or ``object``
    (identity)."""
    t = type(x)
    if t in _VALUES or isinstance(x, enum.Enum):
        return KIND_VALUE
    if isinstance(x, torch.Tensor):
        return KIND_TENSOR
    if t in (tuple, list, frozenset) and len(x) <= _SEQ_MAX:
        kinds = {kind_of(v) for v in x}
        return KIND_VALUE if kinds <= {KIND_VALUE} else KIND_OBJECT
    return KIND_OBJECT


def argprint(x: Any, keep: dict[int, object]) -> Hashable:
    """The fingerprint of one argument. Objects compared by identity are put in
    ``keep`` (id -> object), which the caller holds for the step so that no id is
    reused within it."""
    t = type(x)
    if t in _VALUES:
        return (t, NAN) if x != x else (t, x)
    if isinstance(x, torch.Tensor):
        keep[id(x)] = x
        return ("T", id(x), tag(x))
    if t in (tuple, list) and len(x) <= _SEQ_MAX:
        return (t, *(argprint(v, keep) for v in x))
    if isinstance(x, enum.Enum):
        return (t, x.value)
    if isinstance(x, np.ndarray) and x.size <= _SMALL_ARRAY:
        return ("A", x.dtype.str, x.shape, x.tobytes())
    keep[id(x)] = x
    return ("O", id(x))


#: objects with more attributes than this are compared by identity even in fields mode
FIELDS_PRINT_MAX: Final = 1024


def fieldprint(x: Any, keep: dict[int, object]) -> dict[str, Hashable] | None:
    """The fingerprints (:func:`argprint`) of an object's attributes, by name, as they
    are at the call: ``fields=True`` compares an object argument by those of the
    attributes the function read, so two copies of one step's metadata (``copy()``,
    or two objects made from the same tensors) count as one input. ``None`` where
    there are no attributes to compare (values, tensors, modules, classes, functions,
    objects with more than ``FIELDS_PRINT_MAX`` attributes).

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Meta:
    ...     lens: torch.Tensor
    ...     n: int
    >>> keep: dict[int, object] = {}
    >>> m = Meta(torch.zeros(2), 2)
    >>> fieldprint(m, keep) == fieldprint(dataclasses.replace(m), keep)
    True
    >>> fieldprint(m, keep) == fieldprint(Meta(m.lens.clone(), 2), keep)
    False
    """
    if kind_of(x) != KIND_OBJECT or isinstance(x, (ModuleType, FunctionType, type)):
        return None
    if type(x) in (tuple, list, frozenset):
        return None
    out: dict[str, Hashable] = {}
    d = getattr(x, "__dict__", None)
    if isinstance(d, dict):
        if len(d) > FIELDS_PRINT_MAX:
            return None
        for name, value in list(d.items()):
            out[name] = argprint(value, keep)
    for c in type(x).__mro__[:-1]:
        slots = c.__dict__.get("__slots__", ())
        for s in (slots,) if isinstance(slots, str) else slots:
            if s in ("__dict__", "__weakref__") or s in out:
                continue
            if s.startswith("__") and not s.endswith("__"):
                s = f"_{c.__name__.lstrip('_')}{s}"  # name mangling
            try:
                out[s] = argprint(object.__getattribute__(x, s), keep)
            except AttributeError:
                continue  # an unset slot
    return out or None


#: tensor digests by ``id``: a weak reference (to tell a reused id), version, digest
Memo = dict[int, tuple["weakref.ref[torch.Tensor]", int, Hashable | None]]


def digest(x: Any, memo: Memo | None = None, depth: int = 0) -> Hashable | None:
    """A digest of a result's contents, or ``None`` when it cannot be taken (a very
    large tensor, an object with nothing to compare).

    ``memo`` remembers tensor digests by identity and version, so a tensor handed up
    through several wrapped calls (or returned again and again) is read once. It holds
    the tensors weakly: a result the program drops is freed, and its entry with it.
    """
    t = type(x)
    if t in _VALUES:
        return (t, NAN) if x != x else (t, x)
    if isinstance(x, torch.Tensor):
        if memo is None or x.is_inference():  # no version counter: read it each time
            return _tensor_digest(x)
        hit = memo.get(id(x))
        version = counter(x)
        if hit is not None and hit[0]() is x and hit[1] == version:
            return hit[2]
        d = _tensor_digest(x)
        memo[id(x)] = (_weak(x, memo), version, d)
        return d
    if isinstance(x, np.ndarray):
        if x.nbytes > DIGEST_MAX_BYTES or x.dtype.hasobject:
            return None
        return ("A", x.dtype.str, x.shape, hash(np.ascontiguousarray(x).tobytes()))
    if isinstance(x, enum.Enum):
        return (t, x.value)
    if depth >= _DEPTH:
        return None
    if t in (tuple, list) or (isinstance(x, tuple) and hasattr(x, "_fields")):
        parts = tuple(digest(v, memo, depth + 1) for v in x)
        return None if None in parts else (t.__name__, parts)
    if isinstance(x, dict):
        try:
            items = sorted(x.items(), key=lambda kv: repr(kv[0]))
        except Exception:
            return None
        entries = tuple((repr(k), digest(v, memo, depth + 1)) for k, v in items)
        return None if any(e[1] is None for e in entries) else ("dict", entries)
    if isinstance(x, (ModuleType, FunctionType, type)):
        return ("O", id(x))
    fields = _fields(x)
    if fields is None:
        return None
    named = tuple((k, digest(v, memo, depth + 1)) for k, v in fields)
    if any(e[1] is None for e in named):
        return None
    return (t.__qualname__, named)


def _weak(x: torch.Tensor, memo: Memo) -> weakref.ref[torch.Tensor]:
    key = id(x)

    def forget(ref: weakref.ref[torch.Tensor]) -> None:
        entry = memo.get(key)
        if entry is not None and entry[0] is ref:  # not a newer tensor's, same id
            memo.pop(key, None)

    return weakref.ref(x, forget)


def _fields(x: Any) -> list[tuple[str, Any]] | None:
    """Every attribute of ``x`` (private ones too), or ``None`` when its state may lie
    elsewhere: two results whose digests are equal must be interchangeable, so an
    object the digest cannot see all of is not digested."""
    cls = type(x)
    if isinstance(x, torch.nn.Module) or not _plain_eq(cls):
        return None  # a module's state is its parameters and hooks; its own __eq__
    names: list[str] = []
    d = getattr(x, "__dict__", None)
    if isinstance(d, dict):
        names.extend(d)
    slotted = 0
    for c in cls.__mro__[:-1]:
        if not c.__flags__ & _HEAPTYPE:
            return None  # a C base (a set, a list): state no attribute shows
        slots = c.__dict__.get("__slots__", ())
        slots = (slots,) if isinstance(slots, str) else slots
        slotted += sum(1 for s in slots if s not in ("__dict__", "__weakref__"))
        for s in slots:
            if s in ("__dict__", "__weakref__"):
                continue
            if s.startswith("__") and not s.endswith("__"):
                s = f"_{c.__name__.lstrip('_')}{s}"  # name mangling
            if s not in names:
                names.append(s)
    # a base made in C as a heap type (functools.partial) keeps state in its instance
    # beyond the slots and the __dict__: it is bigger than those explain
    slotted += (cls.__dictoffset__ > 0) + (cls.__weakrefoffset__ > 0)
    if cls.__basicsize__ > object.__basicsize__ + _POINTER * slotted:
        return None
    if not names or len(names) > _FIELDS_MAX:
        return None
    out: list[tuple[str, Any]] = []
    for name in names:
        try:
            out.append((name, getattr(x, name)))
        except AttributeError:
            continue  # an unset slot
    return out


#: the size of an object pointer: what each slot adds to an instance
_POINTER: Final = struct.calcsize("P")
#: ``type.__flags__``: the class was made by a class statement (or type()), not in C
_HEAPTYPE: Final = 1 << 9


def _plain_eq(cls: type) -> bool:
    """Whether equal fields make equal objects: no ``__eq__`` of its own, or one that
    compares the fields (dataclasses, attrs classes)."""
    return (
        getattr(cls, "__eq__", None) is object.__eq__
        or hasattr(cls, "__dataclass_fields__")
        or hasattr(cls, "__attrs_attrs__")
    )


def _tensor_digest(x: torch.Tensor) -> Hashable | None:
    if type(x) is not torch.Tensor:  # a subclass (debug mode's guarded views)
        with plain_torch():
            return _tensor_digest(x.as_subclass(torch.Tensor))
    try:
        if x.nbytes > DIGEST_MAX_BYTES:
            return None
        if x.requires_grad:
            x = x.detach()
        cpu = x.is_cpu
        host = x if cpu else x.cpu()
        try:
            raw = host.numpy().tobytes()
        except (TypeError, RuntimeError):  # dtypes numpy lacks (bfloat16, float8)
            raw = host.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()
    except Exception:  # sparse, quantized, meta, nested: no contents to compare
        return None
    return ("T", x.shape, x.dtype, "cpu" if cpu else str(x.device), hash(raw))
