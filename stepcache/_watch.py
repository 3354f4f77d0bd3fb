# SPDX-License-Identifier: Apache-2.0
"""Which attributes of an object a call reads: the one recorder of debug mode and the
profiler.

A watch patches a recording ``__getattribute__`` into the object's class. Every user
(debug mode, the profiler's ``ReadRecorder``) goes through `watch`, so
a class has at most one such patch, shared and counted: the class gets its own
``__getattribute__`` back when the last watch on it stops, in whatever order its
users stop (two recorders that each patched and restored for themselves left one
another's wrapper in place when they stopped out of order). Not thread-safe for other
code that patches the same class.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, cast

#: a class's ``__getattribute__``, as its instances' attribute reads call it
_GetAttribute = Callable[[object, str], object]


@dataclasses.dataclass(slots=True)
class _Patch:
    """One class with the recording ``__getattribute__`` in place."""

    cls: type
    #: the class's own ``__getattribute__`` (``None``: it inherited one)
    own: _GetAttribute | None
    #: the ``__getattribute__`` the recording one calls
    original: _GetAttribute
    #: id(object) -> the name set of each watch on it: the watches on this class
    watchers: dict[int, list[set[str]]]
    #: the recording ``__getattribute__``
    wrapper: _GetAttribute


_patched: dict[type, _Patch] = {}
_lock = threading.Lock()


def _patch(cls: type) -> _Patch | None:
    """Patch the recording ``__getattribute__`` into ``cls`` (under ``_lock``); ``None``
    when the class cannot be patched (a built-in class)."""
    own = cls.__dict__.get("__getattribute__")
    # the instances' method: mypy reads ``cls.__getattribute__`` as the class's own
    original = cast("_GetAttribute", cls.__getattribute__)
    watchers: dict[int, list[set[str]]] = {}

    def recording(obj: object, name: str) -> object:
        if (sets := watchers.get(id(obj))) is not None and not name.startswith("__"):
            for names in sets:
                names.add(name)
        return original(obj, name)

    try:
        setattr(cls, "__getattribute__", recording)  # noqa: B010
    except (TypeError, AttributeError):
        return None
    patch = _patched[cls] = _Patch(cls, own, original, watchers, recording)
    return patch


def _unpatch(patch: _Patch) -> None:
    """Put the class's own ``__getattribute__`` back (under ``_lock``), unless other
    code replaced the recording one meanwhile: that one is left as it was set."""
    del _patched[patch.cls]
    if patch.cls.__dict__.get("__getattribute__") is patch.wrapper:
        if patch.own is not None:
            setattr(patch.cls, "__getattribute__", patch.own)  # noqa: B010
        else:
            delattr(patch.cls, "__getattribute__")  # noqa: B010


def unrecorded(obj: object, name: str) -> Any:
    """``getattr(obj, name)``, unseen by any watch: for a read that checks a value
    and is no input of it (debug mode would watch an input on every hit)."""
    if (patch := _patched.get(type(obj))) is not None:
        # a class's __getattr__ answers what the original does not: through getattr
        with contextlib.suppress(AttributeError):
            return patch.original(obj, name)
    return getattr(obj, name)


class Watch:
    """The names of one object's attributes read from `watch` to :meth:`stop`."""

    __slots__ = ("_patch", "names", "obj")

    def __init__(self, obj: object, patch: _Patch | None) -> None:
        #: held, so that no other object takes its ``id`` while it is watched
        self.obj = obj
        self.names: set[str] = set()
        self._patch: _Patch | None = patch
        if patch is not None:  # one of the watches on its class (`watch` holds _lock)
            patch.watchers.setdefault(id(obj), []).append(self.names)

    def stop(self) -> set[str]:
        """Stop watching (again: nothing more); the names read. The last watch on a
        class puts the class's own ``__getattribute__`` back."""
        patch, self._patch = self._patch, None
        if patch is not None:
            with _lock:
                sets = patch.watchers.get(id(self.obj), [])
                sets[:] = [names for names in sets if names is not self.names]
                if not sets:
                    patch.watchers.pop(id(self.obj), None)
                if not patch.watchers:  # the last watch on its class
                    _unpatch(patch)
        return self.names


def watch(obj: object) -> Watch | None:
    """Start recording the attributes read on ``obj``; ``None`` when its class cannot
    be patched (a built-in class: ``Watch(obj, None)`` records nothing)."""
    with _lock:
        patch = _patched.get(type(obj)) or _patch(type(obj))
        return Watch(obj, patch) if patch is not None else None


def data_read(owner: object, names: set[str], skip: set[str]) -> list[str]:
    """Of ``names`` (read from ``owner``), the data attributes it has, not in
    ``skip``, sorted: what a value computed from ``owner`` may depend on."""
    # a missing attribute reads as a callable (``callable`` itself): left out
    return sorted(n for n in names - skip if not callable(getattr(owner, n, callable)))
