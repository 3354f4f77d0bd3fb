# SPDX-License-Identifier: Apache-2.0
"""Where an owner keeps its store: its ``_stepcache`` attribute or slot, else a side
table beside it; and the fields that declare that slot."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import weakref
from typing import Final, cast

import torch

from stepcache._entry import weak
from stepcache._errors import OwnerError, StaleCacheError
from stepcache._store import NO_STORE, StepCache

#: The owner attribute (instance ``__dict__`` entry or declared slot) that holds its store.
ATTR: Final = "_stepcache"
#: id(owner) -> (weak reference to it, its store), for owners with no room for one.
_side: dict[int, tuple[weakref.ref[object], StepCache]] = {}


def write(owner: object, store: StepCache | None) -> None:
    """Keep ``store`` in ``owner`` (an attribute or declared slot; a tensor's in the
    side table); the owner's class gets `NO_STORE` as its attribute, unless it has one.
    ``None`` takes its store away: it has none until its next miss.

    Raises:
        OwnerError: The owner has no room for a store.
    """
    if store is None:
        _side.pop(id(owner), None)
        with contextlib.suppress(AttributeError, TypeError):
            object.__delattr__(owner, ATTR)
        return
    # not in a tensor: torch.save writes its __dict__, and weights_only loads refuse it
    if not isinstance(owner, torch.Tensor):
        try:
            object.__setattr__(owner, ATTR, store)  # past a frozen class's __setattr__
        except (AttributeError, TypeError):
            cls = type(owner)
            slotted = cls.__module__ == "builtins" or hasattr(cls, "__slots__")
            # an instance of a slotted class, or of a builtin type: its hits would
            # all take the slow path (a class or module is kept beside it)
            if slotted and not isinstance(owner, (type, types.ModuleType)):
                raise _no_room(owner) from None
        else:
            mark_class(owner)
            return
    # a tensor, a class, a module: kept beside it (its hits take the slow path)
    key = id(owner)  # the callback runs as the owner dies, before its id is reused
    _side[key] = (weak(owner, lambda _: _side.pop(key, None)), store)


def mark_class(owner: object) -> None:
    """Give ``owner``'s class the placeholder `NO_STORE` (unless it has the
    attribute), so that its instances' calls read it instead of raising: an owner
    whose first call only read a scope's store."""
    if not isinstance(owner, torch.Tensor) and not hasattr(type(owner), ATTR):
        with contextlib.suppress(Exception):  # a builtin type may refuse
            setattr(type(owner), ATTR, NO_STORE)


def _no_room(owner: object) -> OwnerError:
    """Why ``owner`` cannot hold a store, and what to change."""
    cls = type(owner)
    name = f"{cls.__module__}.{cls.__qualname__}"
    if cls.__module__ == "builtins":
        return OwnerError(
            f"is a {name}, which cannot hold a step cache (it takes no attributes). "
            "Fix: pass the step's metadata object (an instance of your own class)."
        )
    return OwnerError(
        f"is a {name}, whose __slots__ have no '{ATTR}' slot to hold its step "
        f"cache. Fix: add '{ATTR}' to __slots__ (a dataclass: declare "
        "_stepcache: stepcache.StepCache | None = stepcache.dataclass_cache_field(); "
        "an attrs class: stepcache.cache_field())."
    )


def closed_error(owner: object) -> StaleCacheError:
    """The error of a call through ``owner`` after its store was closed."""
    return StaleCacheError(
        f"the step cache of this {type(owner).__qualname__} was closed (the step is "
        "over), and it was used again. Fix: build a new metadata object for the new "
        "step, or call clear() instead of close() if the object is meant to be reused."
    )


def held(owner: object) -> StepCache | None:
    """The store ``owner`` holds or the side table holds for it, else ``None``; it may
    be a copied owner's, which `stepcache.cache_of` replaces."""
    # not owner.__dict__: on CPython 3.11+ that makes the inline attributes a dict
    try:
        store = getattr(owner, ATTR, None)
    except Exception:  # an odd __getattr__: the side table may hold its store
        store = None
    if isinstance(store, StepCache):
        return store
    side = _side.get(id(owner))
    return side[1] if side is not None and side[0]() is owner else None


def cache_field() -> StepCache | None:
    """An attrs field that holds the store, for slotted attrs classes.

    Declare it as `_stepcache`; it is left out of `__init__`, `repr`, comparisons and
    `attrs.evolve`. Without it, a slotted class's store is kept in a side table (and a
    copy starts with an empty store).

    Examples:
        >>> import attrs, stepcache
        >>> @attrs.define
        ... class Meta:
        ...     _stepcache: stepcache.StepCache | None = stepcache.cache_field()
        >>> m = Meta()
        >>> m, stepcache.cache_of(m) is m._stepcache
        (Meta(), True)
    """
    import attrs

    # typed as the attribute it declares (as attrs.field is, where a default says)
    field = attrs.field(default=None, init=False, repr=False, eq=False, hash=False)
    return cast("StepCache | None", field)


def dataclass_cache_field() -> StepCache | None:
    """A dataclass field that holds the store, for `@dataclass(slots=True)` classes.

    Declare it as `_stepcache`; it is left out of `__init__`, `repr`, comparisons and
    `dataclasses.replace`. The class also needs `weakref_slot=True`.

    Examples:
        >>> import dataclasses, stepcache
        >>> @dataclasses.dataclass(slots=True, weakref_slot=True)
        ... class Meta:
        ...     _stepcache: stepcache.StepCache | None = stepcache.dataclass_cache_field()
        >>> m = Meta()
        >>> m, stepcache.cache_of(m) is m._stepcache
        (Meta(), True)
    """
    return dataclasses.field(default=None, init=False, repr=False, compare=False)
