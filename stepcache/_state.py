# SPDX-License-Identifier: Apache-2.0
"""The core's shared state, a leaf module: the environment variables (read once, at
import), `BYPASS`, the switches (process-wide, not thread-local), the counters, each
context's open scopes, and the registry of decorated functions."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from types import SimpleNamespace
from typing import Any, Final

DEBUG_MODES = ("off", "checks", "verify")
_OFF, _ON = ("0", "false", "no", "off"), ("1", "true", "yes", "on")


def _env(name: str, modes: tuple[str, ...], default: str) -> str:
    """The mode ``$name`` sets, one of ``modes`` (0 and 1 mean the first two)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower() or default
    value = modes[0] if value in _OFF else modes[1] if value in _ON else value
    if value not in modes:
        raise ValueError(f"{name} must be one of {modes} or 0/1 (got {raw!r})")
    return value


#: ``STEPCACHE_DEBUG_GUARD=0``: debug mode hands out plain tensors, not guarded views.
STEPCACHE_DEBUG_GUARD: bool = _env("STEPCACHE_DEBUG_GUARD", ("off", "on"), "on") == "on"


class _Bypass:
    """The key that means "compute, don't cache"."""

    def __repr__(self) -> str:
        return "stepcache.BYPASS"

    def __reduce__(self) -> str:
        return "BYPASS"  # pickles and copies as this module's BYPASS itself


BYPASS: Final = _Bypass()
"""Returned by a key function: compute the value and do not cache it.

Such a call runs the function every time and counts as a *bypass* in
[`stats()`][stepcache.stats]. Use it for values that must not be shared: DeepSeek V4's
C4A layers build their sparse indices per layer, the other layers share one per step.

Examples:
    >>> import stepcache
    >>> def kind_or_bypass(md, kind):
    ...     return stepcache.BYPASS if kind == "c4a" else kind
    >>> @stepcache.step_cached(key=kind_or_bypass, name="ex.sparse")
    ... def sparse_index(md, kind):
    ...     print("building", kind)
    >>> class SWAMetadata: pass
    >>> md = SWAMetadata()
    >>> for kind in ("c128a", "c128a", "c4a", "c4a"):
    ...     sparse_index(md, kind)
    building c128a
    building c4a
    building c4a
"""

#: ``[disabled, debug mode]``: ``STEPCACHE_DISABLE=1`` and ``STEPCACHE_DEBUG`` start them
switches: list[Any] = [
    _env("STEPCACHE_DISABLE", ("off", "on"), "off") == "on",
    _env("STEPCACHE_DEBUG", DEBUG_MODES, "off"),
]
#: ``SLOW[0]``: a switch is on, so every call takes the slow path (the hit path's one
#: read: a list item is the cheapest mutable global)
SLOW: list[bool] = [switches[0] or switches[1] != "off"]
_lock = threading.Lock()  # held to set a switch or to change the registry
new_id = itertools.count(1).__next__  # a new function's id: 1, 2, ...
#: every decorated function alive (a `CachedFunction`), by its id
_by_id: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _set(index: int, value: Any) -> Any:
    """Set switch ``index`` (0: disabled, 1: debug mode); return its old value."""
    if index == 0 and not isinstance(value, bool):
        raise TypeError(f"set_disabled() takes a bool (got {value!r})")
    if index == 1 and value not in DEBUG_MODES:
        raise ValueError(f"debug mode must be one of {DEBUG_MODES} (got {value!r})")
    with _lock:
        before, switches[index] = switches[index], value
        SLOW[0] = switches[0] or switches[1] != "off"
    return before


@contextlib.contextmanager
def _switched(index: int, value: Any) -> Iterator[None]:
    before = _set(index, value)
    try:
        yield
    finally:
        _set(index, before)


def set_disabled(value: bool) -> None:
    """Turn caching off (`True`) or back on (`False`), for every decorated function.

    While off, decorated functions call straight through, each call counted as a bypass.

    Examples:
        >>> import stepcache
        >>> stepcache.set_disabled(True)
        >>> stepcache.get_disabled()
        True
        >>> stepcache.set_disabled(False)
    """
    _set(0, value)


def get_disabled() -> bool:
    """Return whether caching is off.

    Examples:
        >>> import stepcache
        >>> stepcache.get_disabled()
        False
    """
    return bool(switches[0])


def disabled() -> contextlib.AbstractContextManager[None]:
    """Within the block, decorated functions call straight through (nestable).

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.disabled")
        ...     def value(self):
        ...         print("computing")
        >>> with stepcache.disabled():
        ...     Meta().value()
        computing
        >>> stepcache.stats()["ex.disabled"].bypasses
        1
    """
    return _switched(0, True)


def set_debug(mode: str) -> None:
    """Set the debug mode: `"off"`, `"checks"` or `"verify"`.

    `verify` also recomputes on every hit and compares: see the
    [debug mode guide](../debug.md). Debug mode is not thread-safe.

    Examples:
        >>> import stepcache
        >>> stepcache.set_debug("checks")
        >>> stepcache.get_debug()
        'checks'
        >>> stepcache.set_debug("off")
    """
    _set(1, mode)


def get_debug() -> str:
    """Return the debug mode now: `"off"`, `"checks"` or `"verify"`.

    Examples:
        >>> import stepcache
        >>> with stepcache.debug("verify"):
        ...     stepcache.get_debug()
        'verify'
    """
    return str(switches[1])


def debug(mode: str = "checks") -> contextlib.AbstractContextManager[None]:
    """Within the block, run in debug `mode` (nestable); default `"checks"`.

    Examples:
        >>> import stepcache
        >>> with stepcache.debug("verify"):
        ...     with stepcache.debug():
        ...         stepcache.get_debug()
        ...     stepcache.get_debug()
        'checks'
        'verify'
    """
    return _switched(1, mode)


class Counts:
    """The events of one decorated function (`stats()`), or of one function in one
    store (`StepCache.stats()`); every count of stepcache is one of these. Counted
    without a lock, as ``functools.lru_cache`` counts: two threads counting at once
    may lose one."""

    __slots__ = ("bypasses", "hits", "invalidations", "misses")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.hits = self.misses = self.bypasses = self.invalidations = 0


class Absent(dict[Any, Any]):
    """A dict whose every missing key finds one entry: a function's absent entry."""

    __slots__ = ("absent",)

    def __init__(self, absent: Any = None) -> None:
        super().__init__()
        self.absent = absent

    def __missing__(self, key: Any) -> Any:
        return self.absent


#: What a hit reads for an owner with no store yet (`stepcache._store` sets it on
#: owner classes): for each keyed function, a table whose every key finds its absent
#: entry, not a raise. A namespace: CPython specializes reads of its attributes; a
#: plain dict: its get() is quicker than a subclass's (a scope's table is this one
#: until its store is made).
NO_STORE = SimpleNamespace(table={})


#: This context's innermost open scope (`stepcache.scope`), or `NO_STORE` while none
#: is open: where an owner without a store looks, read by every first call of a step.
#: A context variable: each thread (and each asyncio task) has its own, and its get()
#: costs a third of a `threading.local` attribute's read. Each scope names the one it
#: is nested in (``Scope._outer``); a nested scope's ``table`` is ``None`` while it is
#: open, so the calls in it take the slow path, which joins the innermost.
INNERMOST: ContextVar[Any] = ContextVar("stepcache.innermost", default=NO_STORE)
innermost = INNERMOST.get


def current() -> Any:
    """This context's innermost scope that is still open, or `NO_STORE`. A context
    copied while a scope was open (an asyncio task made inside it) still names it
    after it closed; the scopes it is nested in may be open."""
    inner = innermost()
    while inner is not NO_STORE and not inner.open:
        inner = inner._outer
    return inner


def open_here(scope: Any) -> bool:
    """Whether ``scope`` is open in this context (innermost or enclosing)."""
    inner = innermost()
    while inner is not NO_STORE:
        if inner is scope:
            return bool(scope.open)
        inner = inner._outer
    return False


def register(fn: Any) -> None:
    with _lock:
        _by_id[fn.fid] = fn


def all_functions() -> list[Any]:
    with _lock:
        return sorted(_by_id.values(), key=lambda f: f.fid)


def name_of(fid: int) -> str:
    fn = _by_id.get(fid)
    return fn.name if fn is not None else f"<function #{fid}>"


def by_name(rows: Iterable[tuple[int, Sequence[int]]]) -> dict[str, list[int]]:
    """Counts per function id, added up per name: functions that share a name (a
    factory's, say) share its row."""
    out: dict[str, list[int]] = {}
    for fid, counts in rows:
        row = out.setdefault(name_of(fid), [0] * len(counts))
        row[:] = map(sum, zip(row, counts, strict=True))
    return out
