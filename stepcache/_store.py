# SPDX-License-Identifier: Apache-2.0
"""The per-step store (`StepCache`): its table of entries, its counts, its lifetime."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

import numpy as np
import torch

from stepcache._entry import Entry, walk
from stepcache._errors import StaleCacheError
from stepcache._kinds import strided
from stepcache._registry import by_name

if TYPE_CHECKING:
    from stepcache._scope import Scope

#: What an invalidation adds to a function's count in a store (its misses are the
#: low part): a store counts each function in one int.
INVALIDATION: Final = 1 << 48

#: Every store alive, once `live_caches()` was called.
_live: dict[weakref.ref[StepCache], None] = {}
_live_pop = _live.pop  # a dead store's reference removes itself: no Python code runs
#: ``TRACKING[0]``: `live_caches()` was called, so each new store registers itself
TRACKING = [False]
_tracking_lock = threading.Lock()
#: a function's slot in a table: its entry, or {key: entry} for a keyed function
Slot = Entry | dict[object, Entry]


class _ClosedTable(dict[int, Slot]):
    """A closed store's table (`CLOSED`): empty, and what a miss that finishes after
    the close writes into it is dropped, so that no write needs to test the store."""

    __slots__ = ()

    def __setitem__(self, fid: int, slot: Slot) -> None:
        pass


CLOSED: Final = _ClosedTable()


class NoStore:
    """What an owner's class holds as its ``_stepcache`` until the owner has a store
    of its own (`NO_STORE`), and what `stepcache._scope` names while no scope is
    open: a lookup in its table finds nothing."""

    __slots__ = ()
    table: Final[dict[int, Slot]] = {}  # never written

    def __repr__(self) -> str:
        return "<stepcache: no store>"


NO_STORE: Final = NoStore()


class StepCache:
    """The entries cached for one step's metadata object (its *owner*).

    Kept in its owner, which it refers to only weakly: it is freed with the owner.
    `close()` ends the step early: it drops everything, and later use through its owner
    raises [`StaleCacheError`][stepcache.StaleCacheError]. An owner's store comes from
    [`cache_of()`][stepcache.cache_of]; [`attach()`][stepcache.attach] shares it in a step.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.rows")
        ...     def rows(self):
        ...         return torch.arange(3)
        >>> md = Meta()
        >>> store = stepcache.cache_of(md)
        >>> _ = md.rows()
        >>> store, store.stats()
        (<StepCache 1 entries>, {'ex.rows': {'entries': 1, 'bytes': 24, 'misses': 1, 'invalidations': 0}})
        >>> store.close()
        >>> store
        <StepCache closed>
        >>> md.rows()
        Traceback (most recent call last):
        stepcache.StaleCacheError: the step cache of this Meta was closed (the step is over), and it was used again. Fix: build a new metadata object for the new step, or call clear() instead of close() if the object is meant to be reused.
    """

    __slots__ = (
        "__weakref__",
        "_counts",
        "_first",
        "_kept",
        "_members",
        "scope",
        "table",
    )

    # Set when first needed, read with getattr(): most of a step's stores never need
    # them, and a fresh owner's first call makes a store.
    #: id -> weak reference of each attached owner; replaced, never changed
    _members: dict[int, weakref.ref[object]] | None
    #: function id -> the misses its live entries do not show, + invalidations *
    #: INVALIDATION (`stats`): a step's first miss of each function counts as the
    #: entry it stores, at no cost
    _counts: dict[int, int] | None
    _kept: list[object] | None  # made by keep_alive()

    def __init__(self, owner: object | None = None, scope: Scope | None = None) -> None:
        #: function id -> its `Slot`: what a hit reads (`CLOSED` once closed)
        self.table: dict[int, Slot] = {}
        # the id of the owner that made it: an object that holds this store and has
        # this id is that owner (a copy that holds it was made while it was alive)
        self._first = None if owner is None else id(owner)
        #: the scope whose store this is (`stepcache.scope`), or ``None``
        self.scope = scope
        if TRACKING[0]:
            track(self)

    @property
    def closed(self) -> bool:
        """Whether [`close()`][stepcache.StepCache.close] was called (the step is over)."""
        return self.table is CLOSED

    def keep_alive(self, obj: object) -> None:
        """Hold a reference to ``obj`` until the step ends (close, or the owner goes):
        a pinned staging tensor that a ``non_blocking`` copy still reads, say."""
        if self.closed:
            raise StaleCacheError(
                "keep_alive() on a closed StepCache (its step is over)"
            )
        # a new list, not append(): a copied owner's store shares the list it started with
        self._kept = [*(getattr(self, "_kept", None) or ()), obj]

    def clear(self) -> None:
        """Drop every entry (and kept object); the store stays open for the same owner."""
        self._drop(self.table)

    def close(self) -> None:
        """End the step: drop every entry and refuse any later use."""
        table, self.table = self.table, CLOSED  # first: later writes are dropped
        self._drop(table)

    def _drop(self, table: dict[int, Slot]) -> None:
        for fid, slot in list(table.items()):  # their misses stay counted
            self._count(fid, len(slot) if slot.__class__ is dict else 1)
        table.clear()  # in place: an open scope reads this table too
        self._kept = None

    def stats(self) -> dict[str, dict[str, int]]:
        """Per-function entries, bytes, misses and invalidations in this store (hits and
        bypasses skip the store: [`stats()`][stepcache.stats] counts them)."""
        sizes, counts, rows = measure((self,)), getattr(self, "_counts", None) or {}, []
        for f in {**counts, **sizes}:
            entries, size = sizes.get(f, (0, 0))
            # each live entry is one miss here, besides those `_counts` keeps
            invalidations, misses = divmod(counts.get(f, 0) + entries, INVALIDATION)
            rows.append((f, (entries, size, misses, invalidations)))
        names = ("entries", "bytes", "misses", "invalidations")
        return {n: dict(zip(names, c, strict=True)) for n, c in by_name(rows).items()}

    def __len__(self) -> int:
        return sum(1 for _ in self.entries())

    def __repr__(self) -> str:
        return f"<StepCache {'closed' if self.closed else f'{len(self)} entries'}>"

    def __copy__(self) -> StepCache:
        return self  # shared, not copied: a copy would claim the same owner

    def __reduce__(self) -> tuple[Callable[[], StepCache], tuple[()]]:
        return (StepCache, ())  # deepcopy and pickle start an empty store

    def belongs_to(self, owner: object) -> bool:
        """Whether ``owner`` made this store or was attached to it."""
        if self._first == id(owner):
            return True
        member = (getattr(self, "_members", None) or {}).get(id(owner))
        return member is not None and member() is owner

    def made_by(self, owner: object) -> bool:
        """Whether this is ``owner``'s own open store, outside any scope (a scope's
        store was made by no owner): the one a generated miss may write without the
        slow path."""
        return self._first == id(owner) and self.table is not CLOSED

    def share_unbound(self, original: StepCache) -> None:
        """Start with what ``original`` (the store a copied owner carried) holds that
        may serve another owner: its kept objects and its entries with dependencies."""
        self._kept = getattr(original, "_kept", None)
        for fid, slot in list(original.table.items()):
            pairs = list(slot.items()) if isinstance(slot, dict) else [(NO_KEY, slot)]
            for key, entry in pairs:
                if entry.bound is None:
                    self.put(fid, key, entry, None)
                    self._count(fid, -1)  # not a miss here

    def add_member(self, owner: object, ref: weakref.ref[object]) -> None:
        """Count ``owner`` (``ref``: a weak reference to it) among this store's."""
        self._members = {**(getattr(self, "_members", None) or {}), id(owner): ref}

    def lookup(self, fid: int, key: object) -> Entry | None:
        """The entry of function ``fid`` and ``key`` (`NO_KEY`: it is not keyed), or
        ``None``; an unhashable key raises `TypeError`, whether or not the function
        has entries."""
        if key is NO_KEY:
            return self.table.get(fid)  # type: ignore[return-value]
        return self.table.get(fid, {}).get(key)  # type: ignore[union-attr]

    def put(self, fid: int, key: object, entry: Entry, stale: Entry | None) -> bool:
        """Store ``entry`` (``key``: `NO_KEY` for an unkeyed function) in place of
        ``stale``, the entry found that no longer served (or ``None``), and count its
        miss (a live entry counts as one); return whether it was an invalidation
        (``stale`` was its owner's). No lock: each write is one dict operation, and
        what it wrote into a table that a close replaced meanwhile is dropped again."""
        table = self.table
        if key is NO_KEY:
            table[fid] = entry
        elif (slot := table.get(fid)) is None:
            table[fid] = {key: entry}
        else:
            slot[key] = entry  # type: ignore[index]
        if table is not self.table:
            self._drop(table)
        if stale is None:  # its miss is the entry it stored
            return False
        # it replaced ``stale``: that entry's miss no longer shows
        invalidation = stale.bound is None or stale.bound() is entry.owner()
        self._count(fid, 1 + INVALIDATION if invalidation else 1)
        return invalidation

    def _count(self, fid: int, n: int) -> None:
        if (counts := getattr(self, "_counts", None)) is None:
            counts = self._counts = {}
        counts[fid] = counts.get(fid, 0) + n

    def keys(self, fid: int) -> list[object]:
        """The keys of a keyed function's entries."""
        return list(self.table.get(fid) or ())  # type: ignore[arg-type]

    def entries(self) -> Iterator[tuple[int, Entry]]:
        """Yield (function id, entry) pairs of the live entries."""
        for fid, slot in list(self.table.items()):
            for entry in list(slot.values()) if isinstance(slot, dict) else (slot,):
                yield fid, entry


#: the key of an unkeyed function's entry
NO_KEY: Final = object()


def track(store: StepCache) -> None:
    """Register a store with `live_caches()`."""
    _live[weakref.ref(store, _live_pop)] = None


def live_caches() -> list[StepCache]:
    """Every store alive: tracked from the first call, which finds those alive then
    among the garbage collector's objects."""
    with _tracking_lock:
        if not TRACKING[0]:
            # flag first: a later store registers itself, an earlier one is in the scan
            TRACKING[0] = True
            for obj in gc.get_objects():
                # not one torch.compile's tracing made without __init__, now garbage
                if type(obj) is StepCache and hasattr(obj, "table"):
                    track(obj)
    # no duplicates: live weak references to one store are equal keys
    return [store for ref in list(_live) if (store := ref()) is not None]


def measure(stores: Iterable[StepCache]) -> dict[int, tuple[int, int]]:
    """Function id -> (entries, bytes of strided tensors' and arrays' data) in
    ``stores``, each entry counted once."""
    out: dict[int, tuple[int, int]] = {}
    # by id: a copied owner's store shares the original's entries
    unique = {id(e): (fid, e) for store in stores for fid, e in store.entries()}
    for fid, entry in unique.values():
        found: list[torch.Tensor | np.ndarray] = []
        walk(entry.value, found.append, (torch.Tensor, np.ndarray))
        # a view counts its own elements, not its storage
        data = [x for x in found if not isinstance(x, torch.Tensor) or strided(x)]
        entries, size = out.get(fid, (0, 0))
        out[fid] = (entries + 1, size + sum(x.nbytes for x in data))
    return out
