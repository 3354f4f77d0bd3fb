# SPDX-License-Identifier: Apache-2.0
"""Which attributes of its object arguments a call reads (for ``depends_on``).

While a call is recorded, the class of each object argument gets a recording
``__getattribute__`` (the class's own one is put back when the last recorded call
using it returns, or the last of debug mode's recordings on it stops: both use
``stepcache._watch``). Only the first few calls of each function are recorded, so the
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
>>> sorted(handle[id(meta)].names), "__getattribute__" in Meta.__dict__
(['n'], False)
"""

from __future__ import annotations

import enum
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

import numpy as np
import torch

from stepcache._watch import Watch, watch

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


class ReadRecorder:
    """Records attribute reads on chosen objects, across nested calls, through
    stepcache's one recorder (``stepcache._watch``): a class that debug mode
    watches at the same time is patched once and restored when the last of them
    stops, whatever the order."""

    def __init__(self) -> None:
        #: the watches started and not yet stopped (ended by :meth:`restore_all`)
        self._live: dict[int, Watch] = {}

    def start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        skip: dict[int, object] | None = None,
    ) -> dict[int, Watch] | None:
        """Start recording reads on the object arguments (but not those in ``skip``,
        by id); the handle maps each watched object's id to its watch (``.names``:
        the names read)."""
        handle: dict[int, Watch] = {}
        for obj in (*args, *kwargs.values()):
            if isinstance(obj, _SKIP) or id(obj) in handle:
                continue
            if skip and skip.get(id(obj)) is obj:
                continue
            w = watch(obj)
            if w is None:
                continue
            handle[id(obj)] = w
            self._live[id(w)] = w
        return handle or None

    def stop(self, handle: dict[int, Watch]) -> None:
        """Stop the recording started by :meth:`start`."""
        for w in handle.values():
            w.stop()
            self._live.pop(id(w), None)

    def restore_all(self) -> None:
        """Stop every watch still running (on exit, also after an error): each class
        this profile patched gets its own ``__getattribute__`` back, unless debug
        mode still watches it (then its last watch does that)."""
        live, self._live = self._live, {}
        for w in live.values():
            w.stop()
