# SPDX-License-Identifier: Apache-2.0
"""Dependency fingerprints: what an entry remembers of each input it was computed from.

Production fingerprints are what the hit path compares, so they are cheap:

* a tensor: the object itself and its in-place version counter (``_version``). In-place
  ops, ``resize_`` and ``set_`` bump the counter; a changed shape, dtype or device on the
  same object is only possible through such an op or through ``.data =``, which debug
  mode's deep fingerprint catches;
* a scalar (int, float, bool, str, None, dtype, device, enum, tuples of those): its value
  and type;
* a list, dict or set of scalars: a snapshot of its contents;
* anything else (numpy arrays, objects): the object's identity.

Deep fingerprints (debug mode) add shape, dtype, data pointer and, for small CPU
tensors and numpy arrays, the contents.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import numpy as np
import torch

__all__ = [
    "ID",
    "SNAP",
    "VAL",
    "VALUE_CLASSES",
    "content_probe",
    "deep",
    "deep_unchanged",
    "describe",
    "fingerprint",
    "snapshot",
]


class _Kind:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


#: compared by value and type
VAL: Final = _Kind("VAL")
#: compared by identity
ID: Final = _Kind("ID")
#: compared by a snapshot of the contents
SNAP: Final = _Kind("SNAP")

_SCALARS = (
    int,
    float,
    complex,
    bool,
    str,
    bytes,
    type(None),
    torch.dtype,
    torch.device,
)

#: CPU tensors and arrays up to this many elements are fingerprinted by contents in
#: debug mode.
DEEP_CONTENT_LIMIT = 4096


def _is_value(x: object) -> bool:
    if isinstance(x, (_SCALARS, enum.Enum, np.generic, slice)):
        return True
    if type(x) in (tuple, frozenset):
        return all(_is_value(v) for v in x)  # type: ignore[attr-defined]
    return False


def snapshot(x: Any) -> Any:
    """A comparable copy of a list, dict or set (or ``None`` if it holds non-scalars)."""
    if isinstance(x, (list, bytearray)):
        items = tuple(x)
        return (type(x), items) if all(_is_value(v) for v in items) else None
    if isinstance(x, dict):
        pairs = tuple(x.items())
        return (type(x), pairs) if all(_is_value(v) for p in pairs for v in p) else None
    if isinstance(x, set):
        fs = frozenset(x)
        return (type(x), fs) if all(_is_value(v) for v in fs) else None
    return None


#: exact classes compared by value, answered without the general tests below
VALUE_CLASSES: Final = frozenset(
    {int, float, bool, str, bytes, type(None), torch.dtype, torch.device}
)


def fingerprint(x: Any) -> tuple[Any, Any]:
    """``(obj, kind_or_version)`` as stored in an entry for one dependency."""
    cls = x.__class__
    if cls is torch.Tensor:
        return x, x._version
    if cls in VALUE_CLASSES:
        return x, VAL
    if isinstance(x, torch.Tensor):
        return x, x._version
    if _is_value(x):
        return x, VAL
    snap = snapshot(x)
    if snap is not None:
        return snap, SNAP
    return x, ID


def matches(x: Any, o: Any, v: Any) -> bool:
    """The hit path's comparison, as a function (the generated code inlines it)."""
    if x is o and (v.__class__ is not int or x._version == v):
        return True
    if v is VAL:
        return bool(x.__class__ is o.__class__ and x == o)
    if v is SNAP:
        return bool(snapshot(x) == o)
    return False


def deep(x: Any) -> Any:
    """A deep, comparable fingerprint for debug mode.

    For a tensor it adds what the production fingerprint (identity and version) cannot
    see: the data pointer, shape and dtype (a ``.data =`` swap) and, for small CPU
    tensors, the contents (a write through ``.numpy()`` or ``data_ptr()``).
    """
    if isinstance(x, torch.Tensor):
        content: Any = None
        if x.is_cpu and x.numel() <= DEEP_CONTENT_LIMIT and x.layout is torch.strided:
            content = x.tolist()
        return ("tensor", x.shape, x.dtype, x.data_ptr(), content)
    if isinstance(x, np.ndarray):
        body: Any = x.tobytes() if x.size <= DEEP_CONTENT_LIMIT else None
        return ("ndarray", id(x), x.shape, x.dtype.str, body)
    if _is_value(x):
        return ("value", type(x), x)
    snap = snapshot(x)
    if snap is not None:
        return ("snapshot", snap)
    return ("object", id(x))


def content_probe(x: Any) -> tuple[np.ndarray, bytes] | None:
    """A numpy view of a small CPU tensor's memory, and its bytes now (else None).

    Reading the view again is the cheapest way to see a write that did not move the
    version counter; :func:`deep_unchanged` uses it when it is given one.
    """
    try:
        if (
            isinstance(x, torch.Tensor)
            and x.is_cpu
            and x.layout is torch.strided
            and x.numel() <= DEEP_CONTENT_LIMIT
        ):
            view = x.detach().numpy()
            return view, view.tobytes()
    except Exception:
        pass  # a tensor numpy cannot view (conjugated, say): no probe
    return None


def deep_unchanged(
    x: Any, before: Any, probe: tuple[np.ndarray, bytes] | None = None
) -> bool:
    """``deep(x) == before``, reading as little as possible when nothing changed.

    A tensor whose data pointer, shape and dtype are unchanged is still the small CPU
    tensor (or not) it was, so only its contents are read again: through ``probe``
    (from :func:`content_probe` when ``before`` was taken) if given.

    >>> t = torch.tensor([1, 2])
    >>> before, probe = deep(t), content_probe(t)
    >>> deep_unchanged(t, before, probe)
    True
    >>> t.numpy()[0] = 7  # a write that does not move the version counter
    >>> deep_unchanged(t, before, probe), deep_unchanged(t, before)
    (False, False)
    """
    try:
        if before[0] == "tensor" and isinstance(x, torch.Tensor):
            if (
                x.data_ptr() != before[3]
                or x.dtype is not before[2]
                or x.shape != before[1]
            ):
                return False
            if before[4] is None:
                return True
            if probe is not None:
                return probe[0].tobytes() == probe[1]
            return bool(x.tolist() == before[4])
    except Exception:
        pass  # an odd tensor: the general comparison decides
    return bool(deep(x) == before)


def describe(x: Any) -> str:
    """A short human description of a dependency value, for error messages."""
    if isinstance(x, torch.Tensor):
        text = (
            f"tensor(shape={list(x.shape)}, dtype={x.dtype}, device={x.device}, "
            f"version={x._version}, id=0x{id(x):x}"
        )
        if x.device.type == "cpu" and x.numel() <= 16:
            text += f", values={x.tolist()}"
        return text + ")"
    if isinstance(x, np.ndarray):
        text = f"ndarray(shape={list(x.shape)}, dtype={x.dtype}, id=0x{id(x):x}"
        if x.size <= 16:
            text += f", values={x.tolist()}"
        return text + ")"
    r = repr(x)
    return r if len(r) <= 80 else r[:77] + "..."
