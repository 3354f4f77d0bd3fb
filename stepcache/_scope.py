# SPDX-License-Identifier: Apache-2.0
"""A lifetime the engine names (`scope`): one metadata build, or one draft step."""

from __future__ import annotations

import weakref
from typing import Any

from stepcache._errors import StepCacheError
from stepcache._state import INNERMOST, NO_STORE, current, innermost, open_here
from stepcache._store import StepCache, restore


class _Ended:
    """What a closed scope's store names as its scope."""

    open = False


_ENDED = _Ended()


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
    # first miss; until then its table is the placeholder's, which answers every
    # lookup with an absent entry: a build that caches nothing makes nothing.
    __slots__ = ("_entered", "_joined", "_outer", "_store", "open", "table")

    def __init__(self) -> None:
        self._store: StepCache | None = None
        #: whether the scope is open (a closed one is never reopened)
        self.open = False
        self._entered = False
        #: the scope it was opened in (`_state.INNERMOST`), or `NO_STORE`
        self._outer: Any = NO_STORE
        #: (weak reference to each joined owner, the store it had, or ``None``)
        self._joined: list[tuple[weakref.ref[Any], StepCache | None]] | None = None
        #: what the first calls of owners without a store read (`_state.INNERMOST`);
        #: ``None`` while it is nested: those calls take the slow path
        self.table: dict[int, Any] | None = NO_STORE.table

    def __repr__(self) -> str:
        return f"<stepcache scope {'open' if self.open else 'closed'}>"

    @property
    def store(self) -> StepCache:
        """The store the owners of the scope share."""
        if self._store is None:
            self._store = StepCache(None, self if self.open else _ENDED)
            if self.open and self.table is not None:
                self.table = self._store.table
        return self._store

    def joined(self, owner: object, before: StepCache | None) -> None:
        """Remember the store ``owner`` had before it joined (called by `attach`)."""
        if self._joined is None:
            self._joined = []
        self._joined.append((weakref.ref(owner), before))

    def __enter__(self) -> Scope:
        if self._entered:
            raise StepCacheError("a scope is entered once (make a new scope())")
        self._entered = self.open = True
        outer = self._outer = current()
        if outer is not NO_STORE:
            self.table = None  # nested: the slow path joins owners to it
        INNERMOST.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        inner = innermost()
        if inner is not self:
            if not open_here(self):  # closed, never entered, or another thread's
                raise StepCacheError(
                    "a scope is closed in the thread that opened it, innermost first"
                )
            while inner is not self:  # an inner one left open: closed with it
                inner.__exit__()
                inner = innermost()
        INNERMOST.set(self._outer)
        self.open = False
        # read only where a context copied while it was open still names it (an
        # asyncio task made inside it): those calls take the slow path
        self.table = None
        store = self._store
        if store is None:
            return
        if self._joined:
            for ref, before in reversed(self._joined):
                if (owner := ref()) is not None:
                    restore(owner, store, before)
            self._joined = None
        store.clear()
        # the store no longer names the scope: no cycle left to the collector
        store.scope = _ENDED


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
    inner = current()
    return None if inner is NO_STORE else inner
