# SPDX-License-Identifier: Apache-2.0
"""Which attributes of an owner a call reads: debug mode's recorder.

It patches a recording ``__getattribute__`` into the owner's class while a recording
runs (once per class, whatever the number of recordings; the last one out restores
the class), so it is not thread-safe for other code that patches the same class.
"""

from __future__ import annotations

import threading
from typing import Any

#: class -> its own ``__getattribute__`` (or ``None``) and the (owner, names read)
#: of each recording now
_patched: dict[type, tuple[Any, list[tuple[object, set[str]]]]] = {}
_lock = threading.Lock()


def _patch(cls: Any) -> list[tuple[object, set[str]]] | None:
    """Patch a recording ``__getattribute__`` into ``cls`` unless it is already; its
    recorders (``None``: a built-in class cannot be patched)."""
    if cls in _patched:
        return _patched[cls][1]
    own, original = cls.__dict__.get("__getattribute__"), cls.__getattribute__
    recorders: list[tuple[object, set[str]]] = []

    def recording(obj: Any, name: str) -> Any:
        if not name.startswith("__"):
            for owner, names in tuple(recorders):
                if obj is owner:
                    names.add(name)
        return original(obj, name)

    try:
        cls.__getattribute__ = recording
    except (TypeError, AttributeError):
        return None
    _patched[cls] = (own, recorders)
    return recorders


class Recording:
    """The names of ``owner``'s attributes read from its start to :meth:`stop`."""

    def __init__(self, owner: object) -> None:
        self.owner, self.names = owner, set[str]()
        self._cls = type(owner)
        with _lock:
            self._recorders = _patch(self._cls)
            if self._recorders is not None:
                self._recorders.append((owner, self.names))

    def stop(self) -> set[str]:
        """Stop recording (again: nothing more); the names read."""
        recorders, self._recorders = self._recorders, None
        if recorders is not None:
            with _lock:
                recorders[:] = [r for r in recorders if r[1] is not self.names]
                if not recorders:  # the last recording out restores the class
                    own = _patched.pop(self._cls)[0]
                    if own is not None:
                        setattr(self._cls, "__getattribute__", own)  # noqa: B010
                    else:
                        del self._cls.__getattribute__
        return self.names


def data_read(owner: object, names: set[str], skip: set[str]) -> list[str]:
    """Of ``names`` (read from ``owner``), the data attributes it has, not in
    ``skip``, sorted: what a value computed from ``owner`` may depend on."""
    found = (n for n in names - skip if hasattr(owner, n))
    return sorted(n for n in found if not callable(getattr(owner, n, None)))
