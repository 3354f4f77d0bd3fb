# SPDX-License-Identifier: Apache-2.0
"""Scopes: a lifetime the engine names (one metadata build, or one draft step), each
context's open ones, and how an owner finds its store (its own, or the scope's it
joins)."""

from __future__ import annotations

import threading
import weakref
from contextvars import ContextVar

from stepcache._entry import weak
from stepcache._errors import StaleCacheError, StepCacheError
from stepcache._owners import closed_error, held, write
from stepcache._store import NO_STORE, NoStore, Slot, StepCache

_attach_lock = threading.Lock()


class Scope:
    """A [`scope()`][stepcache.scope]: the store its owners share while it is open.

    It keeps the stores its owners had before they joined it, and gives them back when
    it closes.

    Examples:
        >>> import stepcache
        >>> with stepcache.scope() as s:
        ...     s.open, stepcache.active_scope() is s
        (True, True)
        >>> s.open, stepcache.active_scope()
        (False, None)
    """

    # Opened and closed once per metadata build, between long stretches of the
    # engine's own code: kept to a few attribute writes. Its store is made at its
    # first miss; until then its table is the placeholder's, which finds nothing.
    __slots__ = ("_joined", "_store", "open", "outer", "table")

    def __init__(self) -> None:
        self._store: StepCache | None = None
        #: whether the scope is open (a closed one is never reopened)
        self.open = False
        #: the scope it was opened in, or `NO_STORE`
        self.outer: Scope | NoStore = NO_STORE
        #: (weak reference to each joined owner, the store it had, or ``None``)
        self._joined: tuple[tuple[weakref.ref[object], StepCache | None], ...] = ()
        #: what the first calls of owners without a store read (`innermost`);
        #: ``None`` while it is nested or closed: those calls take the slow path
        self.table: dict[int, Slot] | None = NO_STORE.table

    def __repr__(self) -> str:
        return f"<stepcache scope {'open' if self.open else 'closed'}>"

    @property
    def store(self) -> StepCache:
        """The store the owners of the scope share."""
        if self._store is None:
            if not self.open:  # asked by a context that still names it: kept nowhere
                return StepCache(None, self)
            self._store = StepCache(None, self)
            if self.table is not None:
                self.table = self._store.table
        return self._store

    def remember(self, owner: object, before: StepCache | None) -> None:
        """Keep the store ``owner`` had (``before``) as it joins the scope (a new
        tuple: its close reads the one it finds)."""
        self._joined += ((weakref.ref(owner), before),)

    def __enter__(self) -> Scope:
        if self.open or self.table is None:  # open, or closed (entered before)
            raise StepCacheError("a scope is entered once (make a new scope())")
        self.open = True
        if innermost() is not NO_STORE and (outer := active_scope()) is not None:
            self.outer = outer
            self.table = None  # nested: the slow path joins owners to it
        _INNERMOST.set(self)
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        # not open here: closed, never entered, or another thread's
        if innermost() is not self and not open_here(self):
            raise StepCacheError(
                "a scope is closed in the thread that opened it, innermost first"
            )
        # an inner one left open: closed with it
        while (inner := innermost()) is not self:
            inner.__exit__(None, None, None)  # type: ignore[union-attr]
        _INNERMOST.set(self.outer)
        self.open = False
        self.table = None
        store, self._store = self._store, None  # no cycle left to the collector
        if store is None:
            return
        for ref, before in reversed(self._joined):
            if (owner := ref()) is not None and held(owner) is store:
                write(owner, before)  # or takes its store away (it had none)
        self._joined = ()
        store.clear()


#: This context's innermost open scope, or `NO_STORE` while none is open: where an
#: owner without a store looks, read by every first call of a step. A context
#: variable: each thread (and each asyncio task) has its own.
_INNERMOST: ContextVar[Scope | NoStore] = ContextVar(
    "stepcache.innermost", default=NO_STORE
)
innermost = _INNERMOST.get


def open_here(scope: Scope) -> bool:
    """Whether ``scope`` is open in this context (innermost or enclosing)."""
    inner = innermost()
    while isinstance(inner, Scope) and inner is not scope:
        inner = inner.outer
    return inner is scope and scope.open


def miss_store(place: StepCache | Scope, owner: object) -> StepCache | None:
    """Where a generated miss on ``owner`` stores its entry, given where its hit
    looked (``place``; the generated miss stores a new store itself): the owner's own
    store, the open scope's; ``None`` where the slow path decides (a copy's store, a
    closed one, a scope to join)."""
    if place.__class__ is Scope:
        return place.store  # type: ignore[union-attr]
    if place.__class__ is StepCache and place.made_by(owner):  # type: ignore[union-attr]
        return place if innermost() is NO_STORE else None  # type: ignore[return-value]
    return None


def scope() -> Scope:
    """Open a lifetime in which declared inputs are not written in place: one build.

    An engine opens it around one metadata build, or one draft step: work in which the
    inputs that cached functions declare are promised not to be written in place.
    While it is open in this thread:

    * an owner without a store of its own uses the scope's store, so a value one
      owner computed serves every other owner whose key and declared dependencies
      are the same objects (the metadata objects vLLM builds per KV-cache group from
      one batch layout). A decorated call reads it without joining the scope (no
      write to the owner, nothing to give back); [`cache_of()`][stepcache.cache_of]
      joins it, and while scopes are nested a call joins the innermost;
    * an inference tensor in `depends_on` is matched by identity alone (the scope is
      the promise that nothing writes it in place), so a hit on such a layout costs
      what a hit on tensors with version counters does;
    * an owner joined to an enclosing scope stays in it; a new one joins the innermost.

    When it closes (an exception too), everything it made is dropped and each owner
    gets its own store back: the next call recomputes. Values already handed out stay
    what they are. A scope belongs to its thread (and its asyncio task: the open
    scopes are a context variable): only that thread's calls join owners to it, and
    an owner joined to it must not be used from another thread while it is open.
    Debug mode keeps checking contents inside a scope, which is how a broken promise
    is found (see [limits](../limits.md#scopes)).

    Examples:
        >>> import dataclasses, torch, stepcache
        >>> @dataclasses.dataclass
        ... class Group:
        ...     query_start_loc: torch.Tensor
        ...     @stepcache.step_cached(depends_on=("query_start_loc",), name="ex.scope")
        ...     def lens(self):
        ...         print("computing")
        ...         return self.query_start_loc.diff()
        >>> with torch.inference_mode():
        ...     qsl = torch.tensor([0, 2, 5])
        >>> with stepcache.scope():  # one metadata build: a Group per KV-cache group
        ...     a, b = Group(qsl), Group(qsl)
        ...     a.lens() is b.lens()
        computing
        True
        >>> _ = a.lens()  # the scope is over: computed again
        computing
    """
    return Scope()


def active_scope() -> Scope | None:
    """Return the innermost scope open in this thread, or `None`.

    Examples:
        >>> import stepcache
        >>> stepcache.active_scope() is None
        True
    """
    # A context copied while a scope was open (an asyncio task made inside it) still
    # names it after it closed; the scopes it is nested in may be open.
    inner = innermost()
    while isinstance(inner, Scope) and not inner.open:
        inner = inner.outer
    return inner if isinstance(inner, Scope) else None


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
    if owner is None:  # StepCache(None) would be a store without an owner
        raise StepCacheError(
            "the owner is None: a step-cached function's owner parameter (its first, "
            "or the one named by owner=) must be the step's metadata object"
        )
    inner, own = active_scope(), held(owner)
    if own is not None and own.belongs_to(owner):  # its own, or one it joined
        if own.scope is None and own.closed:
            raise closed_error(owner)
        # joined to a scope still open (an owner of an enclosing scope stays in it),
        # or its own while no scope is open here
        if own.scope.open if own.scope is not None else inner is None:
            return own
    if inner is not None:  # a scope is open here: join the innermost
        return attach(owner, inner.store)
    fresh = StepCache(owner)
    write(owner, fresh)
    # carried by copy.copy (a closed one holds nothing); not a scope's store, whether
    # the scope is over or a copy carried it: nothing to seed
    if own is not None and own.scope is None:
        fresh.share_unbound(own)
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
    if cache.closed:
        raise StaleCacheError("attach(): that StepCache is closed (its step is over)")
    with _attach_lock:
        if not cache.belongs_to(owner):
            if cache.scope is not None:
                cache.scope.remember(owner, held(owner))
            cache.add_member(owner, weak(owner))
        write(owner, cache)
    return cache
