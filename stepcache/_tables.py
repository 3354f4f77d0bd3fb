# SPDX-License-Identifier: Apache-2.0
"""What a hit finds through the placeholder store: an entry that fails every check.

A hit looks its entry up by subscripting (``owner._stepcache._e[fid]``, then
``[key]`` for a keyed function, or ``.get(key, ABSENT)`` for one with ``only=``), the
cheapest lookup there is. An owner with no store
yet (a step's new metadata object) reads the placeholder store of its class
(``_store.NO_STORE``), whose entries are :data:`EMPTY_ENTRIES`: every decorated
function is registered there (`register`), a keyed one with :data:`EMPTY_SLOT`, any
other with :data:`ABSENT`, and any key of the empty slot finds :data:`ABSENT`.
Nothing raises: a caught exception costs about ten
microseconds with the CPU's caches cold, as they are at a step's first call. A real
store's dicts stay plain ``dict``: CPython specializes a subscript of a plain dict
only, and a subclass would cost every hit tens of nanoseconds.

>>> register(-7, keyed=False); register(-8, keyed=True)
>>> EMPTY_ENTRIES[-7] is ABSENT
True
>>> EMPTY_ENTRIES[-8] is EMPTY_SLOT, EMPTY_SLOT["any key"] is ABSENT
(True, True)
>>> EMPTY_SLOT["any key"] = ABSENT
Traceback (most recent call last):
  ...
TypeError: the placeholder store's _FrozenSlot is read-only: it never holds an entry
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["ABSENT", "EMPTY_ENTRIES", "EMPTY_SLOT", "register"]

#: never a dependency's value, fingerprint or a result: compares unequal to them all
_NOTHING = object()

#: the entry found where there is none. Every generated hit check fails on it without
#: raising: an entry bound to its owner checks ``entry[1]() is owner`` (``NoneType()``
#: is None), one with dependencies checks its first dependency against ``entry[2]``
#: and ``entry[3]``.
ABSENT: tuple[Any, ...] = (_NOTHING, type(None), _NOTHING, _NOTHING)


def _read_only(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        f"the placeholder store's {type(self).__name__} is read-only: it never holds "
        "an entry"
    )


class _ReadOnly(dict[Any, Any]):
    """A dict that no store operation writes to (only `register`, past it)."""

    __slots__ = ()
    __setitem__ = __delitem__ = setdefault = update = __ior__ = _read_only
    pop = popitem = clear = _read_only


class _FrozenSlot(_ReadOnly):
    """The slot a keyed function finds in the placeholder."""

    __slots__ = ()

    def __missing__(self, key: Any) -> tuple[Any, ...]:
        return ABSENT


class _FrozenEntries(_ReadOnly):
    """The placeholder store's entries: every decorated function's is there (see
    `register`), so that a lookup finds it without a ``__missing__`` call (a Python
    call: 8 us with the caches cold, measured)."""

    __slots__ = ()


EMPTY_SLOT: dict[Any, Any] = _FrozenSlot()
EMPTY_ENTRIES: dict[int, Any] = _FrozenEntries()


def register(fid: int, keyed: bool) -> None:
    """Give the placeholder store the entry of a new decorated function: the empty slot
    if it is keyed, :data:`ABSENT` if not."""
    dict.__setitem__(EMPTY_ENTRIES, fid, EMPTY_SLOT if keyed else ABSENT)
