# SPDX-License-Identifier: Apache-2.0
"""The per-step store (`StepCache`), how an owner object finds it (or the scope's
store it joins), and what it holds."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch

from stepcache._entry import Entry, no_weakref, strided, walk, weak
from stepcache._errors import OwnerError, StaleCacheError, StepCacheError
from stepcache._source import method
from stepcache._state import NO_STORE, Absent, Counts, by_name, current

#: The owner attribute (instance ``__dict__`` entry or declared slot) that holds its store.
ATTR = "_stepcache"
#: What an invalidation adds to a function's count in a store (`StepCache.missed`:
#: its misses are the low part), and what an invalidating miss adds.
INVALIDATION: Final = 1 << 48
INVALIDATED: Final = INVALIDATION + 1

#: Every store alive, once `live_caches()` was called.
_live: dict[weakref.ref[StepCache], None] = {}
_live_pop = _live.pop  # a dead store's reference removes itself: no Python code runs
#: ``TRACKING[0]``: `live_caches()` was called, so each new store registers itself
TRACKING = [False]
_tracking_lock = threading.Lock()
#: id(owner) -> (weak reference to it, its store), for owners with no room for one.
_side: dict[int, tuple[weakref.ref[Any], StepCache]] = {}
_attach_lock = threading.Lock()


def fill_store(w: str, first: str, scope: str, p: str) -> list[str]:
    """The lines that give new store ``w`` its slots (``first``: its owner's id, or
    ``None``; ``scope``: the scope whose store it is, or ``None``): the one rule, which
    `StepCache.__init__` runs and the generated miss inlines (it makes a store on
    every owner's first call of a step). The names of `STORE_NAMES` are read with
    prefix ``p``."""
    # no weak reference, no counts, no member table until something needs them
    # (fewer objects for the collector to walk)
    return [
        # function id -> entry, or {key: entry} for a keyed function: what a hit reads
        f"{w}.table = {{}}",
        # the id of the owner that made it: an object that holds this store and has
        # this id is that owner (a copy that holds it was made while it was alive)
        f"{w}._first = {first}",
        # id -> weak reference of each attached owner (`attach`); replaced, never
        # changed (no lock to read)
        f"{w}._members = None",
        f"{w}._closed = False",
        # function id -> its misses and invalidations; until one is needed, the id
        # of the one function that missed once (`missed`)
        f"{w}._counts = None",
        f"{w}._kept = None",  # made by keep_alive()
        f"{w}.scope = {scope}",  # the `stepcache.scope` whose store this is
        f"if {p}TRACKING[0]:",
        f"    {p}track({w})",
    ]


def track(store: StepCache) -> None:
    """Register a store with `live_caches()`."""
    _live[weakref.ref(store, _live_pop)] = None


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

    # Its __init__ is compiled from `fill_store`, as attrs writes one from its fields.
    __slots__ = (
        "__weakref__",
        "_closed",
        "_counts",
        "_first",
        "_kept",
        "_members",
        "scope",
        "table",
    )
    table: dict[int, Any]
    _first: int | None
    _members: dict[int, weakref.ref[Any]] | None
    _closed: bool
    _counts: dict[int, int] | int | None
    _kept: list[Any] | None
    scope: Any

    if TYPE_CHECKING:

        def __init__(self, owner: object | None = None, scope: Any = None) -> None: ...

    @property
    def closed(self) -> bool:
        """Whether [`close()`][stepcache.StepCache.close] was called (the step is over)."""
        return self._closed

    def keep_alive(self, obj: Any) -> None:
        """Hold a reference to ``obj`` until the step ends (close, or the owner goes):
        a pinned staging tensor that a ``non_blocking`` copy still reads, say."""
        if self._closed:
            raise StaleCacheError(
                "keep_alive() on a closed StepCache (its step is over)"
            )
        # a new list, not append(): a copied owner's store shares the list it started with
        self._kept = [*(self._kept or ()), obj]

    def clear(self) -> None:
        """Drop every entry (and kept object); the store stays open for the same owner."""
        self.table.clear()  # in place: an open scope reads this table too
        self._kept = None

    def close(self) -> None:
        """End the step: drop every entry and refuse any later use."""
        self._closed = True  # first: a miss that inserts meanwhile then clears again
        self.clear()

    def stats(self) -> dict[str, dict[str, int]]:
        """Per-function entries, bytes, misses and invalidations in this store (hits and
        bypasses skip the store: [`stats()`][stepcache.stats] counts them)."""
        sizes, rows = measure((self,)), []
        counts = self._all_counts()
        for f in {**counts, **sizes}:
            c = counts.get(f) or Counts()
            rows.append((f, (*sizes.get(f, (0, 0)), c.misses, c.invalidations)))
        names = ("entries", "bytes", "misses", "invalidations")
        return {n: dict(zip(names, c, strict=True)) for n, c in by_name(rows).items()}

    def __len__(self) -> int:
        return sum(1 for _ in self.entries())

    def __repr__(self) -> str:
        return f"<StepCache {'closed' if self._closed else f'{len(self)} entries'}>"

    def __copy__(self) -> StepCache:
        return self  # shared, not copied: a copy would claim the same owner

    def __reduce__(self) -> tuple[Callable[[], StepCache], tuple[()]]:
        return (StepCache, ())  # deepcopy and pickle start an empty store

    def belongs_to(self, owner: object) -> bool:
        """Whether ``owner`` made this store or was attached to it."""
        if self._first == id(owner):
            return True
        member = None if self._members is None else self._members.get(id(owner))
        return member is not None and member() is owner

    def _all_counts(self) -> dict[int, Counts]:
        """The counts of each function that missed in this store."""
        counts = self._counts
        if counts is None:
            return {}
        packed = {counts: 1} if isinstance(counts, int) else counts
        out: dict[int, Counts] = {}
        for fid, n in packed.items():
            c = out[fid] = Counts()
            c.invalidations, c.misses = divmod(n, INVALIDATION)
        return out

    def missed(self, fid: int, n: int = 1) -> None:
        """Count a miss of function ``fid``, or with ``n`` an invalidation
        (`INVALIDATION`) or an invalidating miss (`INVALIDATED`). A store's first miss
        is its function's id; then a dict of one packed int per function (no object to
        make per function: a step's stores count a few misses each)."""
        counts = self._counts
        if counts is None:
            if n == 1:
                self._counts = fid
                return
            counts = self._counts = {}
        elif isinstance(counts, int):
            counts = self._counts = {counts: 1}
        counts[fid] = counts.get(fid, 0) + n

    def lookup(self, fid: int, keyed: bool, key: Any) -> Entry | None:
        """The entry of function ``fid`` (and ``key``, if it is keyed), or ``None``; an
        unhashable key raises `TypeError`, whether or not the function has entries."""
        slot = self.table.get(fid)
        if keyed:
            hash(key)
            return None if slot is None else slot.get(key)
        found: Entry | None = slot
        return found

    def insert(self, fid: int, keyed: bool, key: Any, entry: Entry) -> None:
        """Store ``entry``. No lock: each write is one dict operation, and a store
        closed meanwhile is emptied again."""
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


#: the names `fill_store`'s lines read (after their prefix)
STORE_NAMES: Final = {"TRACKING": TRACKING, "track": track}
StepCache.__init__ = method(  # type: ignore[method-assign]
    "<stepcache StepCache.__init__>",
    "__init__(self, owner=None, scope=None)",
    fill_store("self", "None if owner is None else id(owner)", "scope", ""),
    STORE_NAMES,
)


def measure(stores: Iterable[StepCache]) -> dict[int, tuple[int, int]]:
    """Function id -> (entries, bytes of strided tensors' and arrays' data) in
    ``stores``, each entry counted once."""
    out: dict[int, tuple[int, int]] = {}
    seen: set[int] = set()  # a copied owner's store shares the original's entries
    for store in stores:
        for fid, entry in store.entries():
            if id(entry) in seen:
                continue
            seen.add(id(entry))
            found: list[Any] = []  # a view counts its own elements, not its storage
            walk(entry.value, found.append, (torch.Tensor, np.ndarray))
            entries, size = out.get(fid, (0, 0))
            size += sum(
                x.nbytes for x in found if not isinstance(x, torch.Tensor) or strided(x)
            )
            out[fid] = (entries + 1, size)
    return out


def register(fid: int, absent: Entry) -> None:
    """Give the placeholder's table a new keyed function's table, which answers every
    key with its absent entry: its hit looks in an owner's store before it tests for
    the placeholder (any other function tests first, and reads nothing there)."""
    NO_STORE.table[fid] = Absent(absent)


def unregister(fid: int) -> None:
    """Drop the placeholder's table of a keyed function that is gone."""
    NO_STORE.table.pop(fid, None)


def new_store(owner: object) -> StepCache | None:
    """A new store kept in ``owner``, whose class holds `NO_STORE` (``None``: this
    owner has no room for it)."""
    store = StepCache(owner)
    try:
        object.__setattr__(owner, ATTR, store)  # past a frozen class's __setattr__
    except (AttributeError, TypeError):
        return None
    return store


def _write(owner: object, store: StepCache) -> None:
    """Keep ``store`` in ``owner`` (an attribute or declared slot; a tensor's in the
    side table); the owner's class gets `NO_STORE` as its attribute, unless it has one.

    Raises:
        OwnerError: The owner has no room for a store.
    """
    # not in a tensor: torch.save writes its __dict__, and weights_only loads refuse it
    if not isinstance(owner, torch.Tensor):
        try:
            object.__setattr__(owner, ATTR, store)  # past a frozen class's __setattr__
        except (AttributeError, TypeError):
            if _slotted(owner):  # its hits would all take the slow path
                raise _no_room(owner) from None
        else:
            if not hasattr(type(owner), ATTR):
                with contextlib.suppress(Exception):  # a builtin type may refuse
                    setattr(type(owner), ATTR, NO_STORE)
            return
    # a tensor, a class, a module: kept beside it (its hits take the slow path)
    key = id(owner)  # the callback runs as the owner dies, before its id is reused
    try:
        ref = weakref.ref(owner, lambda _: _side.pop(key, None))
    except TypeError:
        raise no_weakref(owner) from None
    _side[key] = (ref, store)


def _slotted(owner: object) -> bool:
    """Whether ``owner`` is an instance of a class of its user's with ``__slots__``
    and no room for a store, or of a builtin type that takes no attributes."""
    cls = type(owner)
    if isinstance(owner, (type, types.ModuleType)):
        return False
    return cls.__module__ == "builtins" or hasattr(cls, "__slots__")


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


def _held(owner: object) -> Any:
    """What ``owner``'s store attribute holds (``None``: nothing it can give)."""
    # not owner.__dict__: on CPython 3.11+ that makes the inline attributes a dict
    try:
        return getattr(owner, ATTR, None)
    except Exception:  # an odd __getattr__: the side table may hold its store
        return None


_UNREAD: Any = object()


def found(owner: object, store: Any = _UNREAD) -> StepCache | None:
    """The store ``owner`` holds (``store``: what `_held` read, if read already) or the
    side table holds for it, else ``None``; it may be a copied owner's, which
    `cache_of` replaces."""
    if store is _UNREAD:
        store = _held(owner)
    if isinstance(store, StepCache):
        return store
    side = _side.get(id(owner))
    return side[1] if side is not None and side[0]() is owner else None


def cache_of(owner: object) -> StepCache:
    """Return the [`StepCache`][stepcache.StepCache] of `owner`, creating it on first use.

    The store is kept in the owner (its `__dict__`, or a `_stepcache` slot: see
    [`cache_field()`][stepcache.cache_field]), else in a side table. A `copy.copy` of
    the owner gets a store of its own, seeded with the entries that declare
    dependencies. Inside a [`scope()`][stepcache.scope], an owner without a store of
    an open scope joins the innermost one: its store is the scope's until the scope
    closes. No lock: of two stores made at once for one owner, the last stays.

    Raises:
        StaleCacheError: The owner's store was closed.
        StepCacheError: The owner's class supports no weak references.

    Examples:
        >>> import stepcache
        >>> class Meta: pass
        >>> m = Meta()
        >>> stepcache.cache_of(m) is stepcache.cache_of(m)
        True
    """
    store = _held(owner)
    inner = current()
    if store is NO_STORE and inner is NO_STORE:  # a plain first use
        fresh = new_store(owner)
        if fresh is not None:
            return fresh
    if owner is None:  # StepCache(None) would be a store without an owner
        raise StepCacheError(
            "the owner is None: a step-cached function's owner parameter (its first, "
            "or the one named by owner=) must be the step's metadata object"
        )
    own: StepCache | None = found(owner, store)
    mine = own is not None and own.belongs_to(owner)
    if own is not None and own.scope is not None:
        if mine and own.scope.open:
            return own  # joined (an owner of an enclosing scope stays in it)
        own, mine = None, False  # a scope that is over, or a copy's: nothing to seed
    if mine and own._closed:  # type: ignore[union-attr]
        raise closed_error(owner)
    if inner is not NO_STORE:  # a scope is open here: join the innermost
        joined: StepCache = attach(owner, inner.store)
        return joined
    if mine:
        return own  # type: ignore[return-value]
    fresh = StepCache(owner)
    _write(owner, fresh)
    if own is not None and not own._closed:
        # carried by copy.copy: share the original's kept objects and unbound entries
        fresh._kept = own._kept
        for fid, slot in list(own.table.items()):
            if isinstance(slot, dict):
                if shared := {k: e for k, e in list(slot.items()) if e.bound is None}:
                    fresh.table[fid] = shared
            elif slot.bound is None:
                fresh.table[fid] = slot
    return fresh


def attach(owner: object, cache: StepCache) -> StepCache:
    """Make `owner` use `cache`, shared on purpose with other objects of one step.

    vLLM builds one metadata object per KV-cache group of a step; attached to one store,
    a value one builder computed serves the others while the dependencies it declares
    match on the caller. Entries without dependencies stay bound to the object that
    computed them (one entry per function and key: another owner's call replaces it).
    Attached to a scope's store, `owner` joins the scope: its own store comes back when
    the scope closes. Returns `cache`.

    Raises:
        StepCacheError: `cache` is not a [`StepCache`][stepcache.StepCache].
        StaleCacheError: `cache` is closed.

    Examples:
        >>> import stepcache
        >>> class Group:
        ...     n = 3
        ...     @stepcache.step_cached(depends_on=("n",))
        ...     def lens(self):
        ...         return list(range(self.n))
        >>> a, b = Group(), Group()
        >>> stepcache.attach(b, stepcache.cache_of(a)) is stepcache.cache_of(b)
        True
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
            if cache.scope is not None:
                cache.scope.joined(owner, found(owner))
            cache._members = {**(cache._members or {}), id(owner): weak(owner)}
        _write(owner, cache)
    return cache


def restore(owner: object, scope_store: StepCache, store: StepCache | None) -> None:
    """Give ``owner`` back ``store`` (``None``: no store) in place of the scope's
    store it joined, unless it holds another one by now."""
    if found(owner) is not scope_store:
        return
    if store is not None:
        _write(owner, store)
        return
    _side.pop(id(owner), None)
    with contextlib.suppress(AttributeError, TypeError):
        object.__delattr__(owner, ATTR)


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


def cache_field() -> Any:
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

    return attrs.field(default=None, init=False, repr=False, eq=False, hash=False)


def dataclass_cache_field() -> Any:
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
