# SPDX-License-Identifier: Apache-2.0
"""Which attributes of its object arguments a call reads (for ``depends_on``).

While a call is recorded, the class of each object argument gets a recording
``__getattribute__`` (the class's own one is put back when the last recorded call
using it returns). Only the first few calls of each function are recorded, so the
cost stays small. Like stepcache's debug mode this patches classes process-wide: it is
not meant for threads racing on the same classes.

>>> class Meta:
...     def __init__(self) -> None:
...         self.n, self.m = 1, 2
>>> meta = Meta()
>>> recorder = ReadRecorder()
>>> handle = recorder.start((meta,), {})
>>> meta.n
1
>>> recorder.stop(handle)
>>> sorted(handle[id(meta)]), "__getattribute__" in Meta.__dict__
(['n'], False)
"""

from __future__ import annotations

import enum
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

import numpy as np
import torch

__all__ = ["ReadRecorder"]

_SKIP = (
    torch.Tensor,
    np.ndarray,
    ModuleType,
    type,
    FunctionType,
    BuiltinFunctionType,
    MethodType,
    enum.Enum,
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    tuple,
    list,
    dict,
    set,
    frozenset,
    type(None),
)


class _Patched:
    """One class with a recording ``__getattribute__`` in place."""

    __slots__ = ("cls", "own", "users", "watchers")

    def __init__(self, cls: type, own: Any) -> None:
        self.cls = cls
        self.own = own
        self.users = 0
        #: id(object) -> the name sets of the calls watching it
        self.watchers: dict[int, list[set[str]]] = {}


class ReadRecorder:
    """Records attribute reads on chosen objects, across nested calls."""

    def __init__(self) -> None:
        self._patched: dict[type, _Patched] = {}

    def start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        skip: dict[int, object] | None = None,
    ) -> dict[int, set[str]] | None:
        """Start recording reads on the object arguments (but not those in ``skip``,
        by id); the handle maps each watched object's id to the names read."""
        handle: dict[int, set[str]] = {}
        for obj in (*args, *kwargs.values()):
            if isinstance(obj, _SKIP) or id(obj) in handle:
                continue
            if skip and skip.get(id(obj)) is obj:
                continue
            patch = self._patch(type(obj))
            if patch is None:
                continue
            names: set[str] = set()
            patch.users += 1
            patch.watchers.setdefault(id(obj), []).append(names)
            handle[id(obj)] = names
        return handle or None

    def stop(self, handle: dict[int, set[str]]) -> None:
        """Stop the recording started by :meth:`start`."""
        for patch in list(self._patched.values()):
            for oid, names in handle.items():
                sets = patch.watchers.get(oid)
                if sets is None:
                    continue
                for i, s in enumerate(sets):
                    if s is names:
                        del sets[i]
                        patch.users -= 1
                        break
                if not sets:
                    del patch.watchers[oid]
            if patch.users <= 0:
                self._unpatch(patch)

    def _patch(self, cls: type) -> _Patched | None:
        patch = self._patched.get(cls)
        if patch is not None:
            return patch
        own = cls.__dict__.get("__getattribute__")
        original: Any = cls.__getattribute__
        patch = _Patched(cls, own)
        watchers = patch.watchers

        def recording(obj: Any, name: str) -> Any:
            sets = watchers.get(id(obj))
            if sets is not None and not name.startswith("__"):
                for s in sets:
                    s.add(name)
            return original(obj, name)

        try:
            setattr(cls, "__getattribute__", recording)  # noqa: B010
        except (TypeError, AttributeError):
            return None
        self._patched[cls] = patch
        return patch

    def _unpatch(self, patch: _Patched) -> None:
        cls = patch.cls
        if patch.own is not None:
            cls.__getattribute__ = patch.own  # type: ignore[method-assign]
        else:
            del cls.__getattribute__
        del self._patched[cls]

    def restore_all(self) -> None:
        """Put every class's own ``__getattribute__`` back (on exit, also after an
        error)."""
        for patch in list(self._patched.values()):
            self._unpatch(patch)
