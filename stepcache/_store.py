# SPDX-License-Identifier: Apache-2.0
"""The per-step store (`StepCache`) and how an owner object finds its store."""

from __future__ import annotations

import contextlib
import gc
import threading
import weakref
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from stepcache._entry import ABSENT, Entry
from stepcache._errors import StaleCacheError, StepCacheError
from stepcache._fingerprint import nbytes
from stepcache._state import name_of

#: The owner attribute (instance ``__dict__`` entry or declared slot) that holds its store.
ATTR = "_stepcache"
#: what a store counts per function (`count`), besides its entries and their bytes,
#: and each count's index
COUNTED = ("misses", "bypasses", "invalidations")
MISSES, BYPASSES, INVALIDATIONS = range(len(COUNTED))

#: every store alive, as weak references, once `live_caches()` has been called (see
#: there); a dead one's reference removes itself (the callback is the dict's own pop,
#: so no Python code runs when a store dies)
_live: dict[weakref.ref[StepCache], None] = {}
_live_pop = _live.pop
_tracking = False
_tracking_lock = threading.Lock()
#: id(owner) -> (weak reference to it, its store), for owners with no room for one
_side: dict[int, tuple[weakref.ref[Any], StepCache]] = {}
_attach_lock = threading.Lock()


class StepCache:
    """The entries cached for one step's metadata object (its *owner*).

    A store lives exactly as long as its owner: it is kept in the owner itself, holds no
    reference back to it (only a weak one) and so is freed by reference counting when the
    owner goes. `close()` ends it early: the step is over, it holds nothing any more, and
    any later use through its owner raises
    [`StaleCacheError`][stepcache.StaleCacheError]. Get an owner's store with
    [`cache_of()`][stepcache.cache_of]; share one store between several metadata
    objects of a step with [`attach()`][stepcache.attach].

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     def __init__(self):
        ...         self.qsl = torch.tensor([0, 2, 3])
        ...     @stepcache.step_cached(depends_on=("qsl",), name="ex.rows")
        ...     def rows(self):
        ...         return torch.repeat_interleave(torch.arange(2), self.qsl.diff())
        >>> md = Meta()
        >>> store = stepcache.cache_of(md)
        >>> store
        <StepCache 0 entries>
        >>> _ = md.rows()
        >>> len(store), store.stats()["ex.rows"]
        (1, {'entries': 1, 'bytes': 24, 'misses': 1, 'bypasses': 0, 'invalidations': 0})
        >>> store.close()
        >>> store
        <StepCache closed>
        >>> md.rows()
        Traceback (most recent call last):
          ...
        stepcache.StaleCacheError: the step cache of this Meta was closed (the step is over), and it was used again. Fix: build a new metadata object for the new step, or call clear() instead of close() if the object is meant to be reused.
    """

    __slots__ = (
        "__weakref__",
        "_attached",
        "_closed",
        "_counts",
        "_kept",
        "_owner_ref",
        "table",
    )

    def __init__(self, owner: object | None = None) -> None:
        #: function id -> entry (unkeyed functions) or {key: entry} (keyed ones): what
        #: a hit reads, and what only this module writes
        self.table: dict[int, Any] = {}
        self._owner_ref = None if owner is None else _weak(owner)
        #: id(owner) -> weak reference, for the owners attach() shares this store with
        self._attached: dict[int, weakref.ref[Any]] | None = None
        self._closed = False
        #: function id -> its counts (as COUNTED names them) seen through this store
        self._counts: dict[int, list[int]] = {}
        #: objects that must live as long as the step (keep_alive())
        self._kept: list[Any] | None = None
        if _tracking:
            _live[weakref.ref(self, _live_pop)] = None

    @property
    def closed(self) -> bool:
        """Whether [`close()`][stepcache.StepCache.close] was called (the step is over)."""
        return self._closed

    def __len__(self) -> int:
        return sum(1 for _ in self.entries())

    def keep_alive(self, obj: Any) -> None:
        """Hold a reference to ``obj`` until the step ends (close, or the owner goes).

        For a pinned staging tensor read by a ``non_blocking`` copy: freeing it before
        the copy ran would let the copy read reused memory.
        """
        if self._closed:
            raise StaleCacheError(
                "keep_alive() on a closed StepCache (its step is over)"
            )
        if self._kept is None:
            self._kept = []
        self._kept.append(obj)

    def clear(self) -> None:
        """Drop every entry (and kept object); the store stays open for the same owner."""
        self.table = {}
        self._kept = None

    def close(self) -> None:
        """End the step: drop every entry and refuse any later use."""
        # the flag first: a miss that inserts meanwhile sees it and empties the store
        # (and values handed out in debug mode read it themselves)
        self._closed = True
        self.clear()

    def stats(self) -> dict[str, dict[str, int]]:
        """Per-function counts for this store: entries, bytes, misses, bypasses,
        invalidations (hits are counted process-wide, see [`stats()`][stepcache.stats])."""
        empty = dict.fromkeys(("entries", "bytes", *COUNTED), 0)
        out = {
            name_of(f): {**empty, **dict(zip(COUNTED, c, strict=True))}
            for f, c in self._counts.items()
        }
        for fid, entry in self.entries():
            row = out.setdefault(name_of(fid), dict(empty))
            row["entries"] += 1
            row["bytes"] += nbytes(entry.value)
        return out

    def __copy__(self) -> StepCache:
        # A copied store would point at the same owner; a store is not copied, shared.
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StepCache:
        # A deep copy of an owner starts a fresh, empty store of its own.
        return StepCache()

    def __reduce__(self) -> tuple[Callable[[], StepCache], tuple[()]]:
        return (StepCache, ())

    def __repr__(self) -> str:
        return f"<StepCache {'closed' if self._closed else f'{len(self)} entries'}>"

    # -- used by the decorator's slow path ----------------------------------------------
    def belongs_to(self, owner: object) -> bool:
        if self._owner_ref is not None and self._owner_ref() is owner:
            return True
        member = (self._attached or {}).get(id(owner))
        return member is not None and member() is owner

    def count(self, fid: int, which: int) -> None:
        """Add one to count ``which`` (`MISSES`, `BYPASSES`, `INVALIDATIONS`) of
        function ``fid``."""
        counts = self._counts.get(fid)
        if counts is None:
            counts = self._counts[fid] = [0] * len(COUNTED)
        counts[which] += 1

    def lookup(self, fid: int, keyed: bool, key: Any) -> Entry | None:
        """The entry of function ``fid`` (and ``key``, if it is keyed), or ``None``."""
        slot = self.table.get(fid)
        found: Entry | None = slot.get(key) if keyed and slot is not None else slot
        return found

    def insert(self, fid: int, keyed: bool, key: Any, entry: Entry) -> None:
        # No lock: each write is one dict operation, and a store closed meanwhile, by
        # another thread, is emptied again.
        if keyed:
            self.table.setdefault(fid, {})[key] = entry
        else:
            self.table[fid] = entry
        if self._closed:
            self.clear()

    def keys(self, fid: int) -> list[Any]:
        """The keys of a keyed function's entries."""
        return list(self.table.get(fid) or ())

    def entries(self) -> Iterator[tuple[int, Entry]]:
        """Yield (function id, entry) pairs of the live entries."""
        for fid, slot in list(self.table.items()):
            for entry in list(slot.values()) if isinstance(slot, dict) else (slot,):
                yield fid, entry


class _Placeholder(dict[Any, Any]):
    """A read-only dict: the placeholder store's table, and a keyed function's slot
    in it, whose every key finds `ABSENT`."""

    __slots__ = ()

    def __missing__(self, key: Any) -> Entry:
        return ABSENT

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the placeholder store is read-only: it never holds an entry")

    __setitem__ = __delitem__ = setdefault = update = pop = clear = _read_only


_EMPTY_SLOT = _Placeholder()
#: What a hit reads for an owner that has no store yet: the class attribute
#: ``_stepcache`` of the owners' classes (see `_write`), so that the hit's plain
#: attribute read and subscripts find `ABSENT` instead of raising (a caught exception
#: is the slowest part of a step's first call). Every decorated function is in its
#: table (`register`), so no lookup calls ``__missing__``. A ``SimpleNamespace``:
#: CPython specializes an instance attribute read only when a same-named class
#: attribute is of a builtin type.
NO_STORE = SimpleNamespace(table=_Placeholder())


def register(fid: int, keyed: bool) -> None:
    """Give the placeholder store's table the entry of a new decorated function."""
    dict.__setitem__(NO_STORE.table, fid, _EMPTY_SLOT if keyed else ABSENT)


def _weak(owner: object) -> weakref.ref[Any]:
    try:
        return weakref.ref(owner)
    except TypeError:
        cls = type(owner).__qualname__
        raise StepCacheError(
            f"stepcache needs weak references to the owner, and {cls} objects do not "
            "support them. Fix: give the class a __weakref__ slot "
            "(@dataclass(slots=True, weakref_slot=True); attrs classes have one by "
            "default)."
        ) from None


def _write(owner: object, store: StepCache) -> None:
    """Keep ``store`` in ``owner`` (its attributes or its declared slot, else the side
    table); the owner's class gets `NO_STORE` as its attribute, unless it has one
    (a declared slot, a field's default, a base class's placeholder)."""
    try:
        # past the class's __setattr__ (a frozen dataclass's, say): not a field
        object.__setattr__(owner, ATTR, store)
    except (AttributeError, TypeError):  # slotted without a slot for it
        key = id(owner)

        def forget(ref: weakref.ref[Any]) -> None:
            if _side.get(key, (None,))[0] is ref:
                _side.pop(key, None)

        _side[key] = (weakref.ref(owner, forget), store)
        return
    cls = type(owner)
    if not hasattr(cls, ATTR):
        # a builtin type, or a metaclass's __setattr__, may refuse
        with contextlib.suppress(Exception):
            setattr(cls, ATTR, NO_STORE)


def store_for(owner: object) -> StepCache:
    """The owner's own open store, created on first use (see `cache_of`): every store
    is found or made here. No lock: two threads making the first call on one owner
    at once may each create a store; the one written last stays (the other's entries
    are computed again on their next use)."""
    # read the generic way (a declared slot, or the instance's attributes), never
    # through owner.__dict__: on CPython 3.11+ that turns the instance's inline
    # attribute values into a dict object of its own
    try:
        store = getattr(owner, ATTR, None)
    except Exception:  # an odd __getattr__
        store = None
    # the common cases first: the owner's own open store, or its class's placeholder
    if (
        store.__class__ is StepCache
        and store._owner_ref is not None
        and store._owner_ref() is owner
        and not store._closed
    ):
        return store
    if store is NO_STORE and not _side:
        fresh = StepCache(owner)
        try:
            object.__setattr__(owner, ATTR, fresh)
            return fresh
        except (AttributeError, TypeError):
            pass  # the class has the placeholder, its instances no place for a store
    if not isinstance(store, StepCache):
        side = _side.get(id(owner))
        store = side[1] if side is not None and side[0]() is owner else None
    if store is not None and store.belongs_to(owner):
        if store._closed:
            raise StaleCacheError(
                f"the step cache of this {type(owner).__qualname__} was closed (the step "
                "is over), and it was used again. Fix: build a new metadata object for "
                "the new step, or call clear() instead of close() if the object is "
                "meant to be reused."
            )
        return store
    fresh = StepCache(owner)
    _write(owner, fresh)
    if store is not None and not store._closed:
        # a store carried over by copy.copy is the original's: the copy's own starts
        # with the entries that declare dependencies (a hit re-checks those), and
        # the kept objects
        fresh._kept = None if store._kept is None else list(store._kept)
        for fid, slot in list(store.table.items()):
            if isinstance(slot, dict):
                if shared := {k: e for k, e in list(slot.items()) if e.bound is None}:
                    fresh.table[fid] = shared
            elif slot.bound is None:
                fresh.table[fid] = slot
    return fresh


def cache_of(owner: object) -> StepCache:
    """Return the [`StepCache`][stepcache.StepCache] of `owner`, creating it on first use.

    The store is kept in the owner: in its `__dict__`, in a `_stepcache` slot declared
    with [`cache_field()`][stepcache.cache_field] or
    [`dataclass_cache_field()`][stepcache.dataclass_cache_field], or, for a slotted class
    without that slot, in a side table keyed by a weak reference to the owner. A copy
    made by `copy.copy` gets a store of its own on first use, seeded with the entries
    that declare dependencies.

    Raises:
        StaleCacheError: The owner's store was closed.
        StepCacheError: The owner's class supports no weak references (give it a
            `__weakref__` slot).

    Examples:
        >>> import stepcache
        >>> class Meta: pass
        >>> m = Meta()
        >>> stepcache.cache_of(m) is stepcache.cache_of(m)
        True
        >>> stepcache.cache_of(m)
        <StepCache 0 entries>
    """
    return store_for(owner)


def attach(owner: object, cache: StepCache) -> StepCache:
    """Make `owner` use `cache`, shared on purpose with other objects of one step.

    vLLM's model runner builds one metadata object per KV-cache group of a step;
    attaching them all to one store lets a value one builder computed serve the others.
    Entries that declare dependencies are reused across the objects while those
    dependencies are identical on the caller (otherwise they are recomputed); entries
    without dependencies stay bound to the object that computed them. Returns `cache`.

    Raises:
        StepCacheError: `cache` is not a [`StepCache`][stepcache.StepCache].
        StaleCacheError: `cache` is closed.

    Examples:
        >>> import stepcache, torch
        >>> class GroupMetadata:
        ...     def __init__(self, qsl):
        ...         self.qsl = qsl
        ...     @stepcache.step_cached(depends_on=("qsl",))
        ...     def lens(self):
        ...         print("computing")
        ...         return self.qsl.diff()
        >>> qsl = torch.tensor([0, 2, 5])
        >>> a, b = GroupMetadata(qsl), GroupMetadata(qsl)
        >>> stepcache.attach(b, stepcache.cache_of(a)) is stepcache.cache_of(b)
        True
        >>> a.lens()
        computing
        tensor([2, 3])
        >>> b.lens() is a.lens()
        True
    """
    if not isinstance(cache, StepCache):
        raise StepCacheError(
            f"attach() needs a StepCache (got {cache!r} that is a {type(cache)!r})"
        )
    if cache._closed:
        raise StaleCacheError("attach(): that StepCache is closed (its step is over)")
    with _attach_lock:
        if not cache.belongs_to(owner):
            cache._attached = {**(cache._attached or {}), id(owner): _weak(owner)}
        _write(owner, cache)
    return cache


def live_caches() -> list[StepCache]:
    """Every store still alive in this process (what `stats()` counts live entries in).

    Stores are tracked only from the first call on, which spares each step's stores a
    weak reference with a callback (docs/benchmarks.md). That call finds the stores
    alive then by one pass over the objects the garbage collector tracks (a store
    moved out of its reach by ``gc.freeze()`` is not listed).
    """
    global _tracking
    with _tracking_lock:
        if not _tracking:
            # the flag first: a store made from now on registers itself, one made
            # before is in the scan (a store reads the flag after it exists)
            _tracking = True
            for obj in gc.get_objects():
                if type(obj) is StepCache:
                    _live[weakref.ref(obj, _live_pop)] = None
    stores = (ref() for ref in list(_live))
    return list({id(s): s for s in stores if s is not None}.values())


def cache_field() -> Any:
    """An attrs field that holds the store, for slotted attrs classes.

    Declare it as `_stepcache` (the name stepcache looks for); it is left out of
    `__init__`, `repr` and comparisons, and `attrs.evolve` does not carry it over.
    Without it, a slotted class's store lives in a side table keyed by a weak reference
    to the owner (a copy then starts with an empty store).

    Examples:
        >>> import attrs, stepcache
        >>> @attrs.define
        ... class Meta:
        ...     n: int
        ...     _stepcache: stepcache.StepCache | None = stepcache.cache_field()
        >>> m = Meta(3)
        >>> m
        Meta(n=3)
        >>> stepcache.cache_of(m) is m._stepcache
        True
    """
    import attrs

    return attrs.field(default=None, init=False, repr=False, eq=False, hash=False)


def dataclass_cache_field() -> Any:
    """A dataclass field that holds the store, for `@dataclass(slots=True)` classes.

    Declare it as `_stepcache`; it is left out of `__init__`, `repr` and comparisons,
    and `dataclasses.replace` does not carry it over. The class also needs
    `weakref_slot=True`: the store refers to its owner weakly.

    Examples:
        >>> import dataclasses, stepcache
        >>> @dataclasses.dataclass(slots=True, weakref_slot=True)
        ... class Meta:
        ...     n: int
        ...     _stepcache: stepcache.StepCache | None = stepcache.dataclass_cache_field()
        >>> m = Meta(3)
        >>> m
        Meta(n=3)
        >>> stepcache.cache_of(m) is m._stepcache
        True
    """
    import dataclasses

    return dataclasses.field(default=None, init=False, repr=False, compare=False)
