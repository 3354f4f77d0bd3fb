# SPDX-License-Identifier: Apache-2.0
"""Process-wide switches, not thread-local: ``disabled`` and the debug mode. While one
is on, ``_state.SLOW[0]`` sends every call to the slow path, which reads them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from stepcache import _state

_lock = threading.RLock()


def _set(index: int, value: Any) -> None:
    with _lock:
        _state.switches[index] = value
        _state.SLOW[0] = _state.switches[0] or _state.switches[1] != "off"


@contextlib.contextmanager
def _switched(index: int, value: Any) -> Iterator[None]:
    """Switch ``index`` (0: disabled, 1: debug mode) set to ``value`` for a block."""
    with _lock:
        before = _state.switches[index]
        (set_disabled, set_debug)[index](value)
    try:
        yield
    finally:
        _set(index, before)


def set_disabled(value: bool) -> None:
    """Turn caching off (`True`) or back on (`False`), for every decorated function.

    While off, decorated functions call straight through; each call counts as a bypass.
    The switch is global, not per thread; a `value` that is not a bool raises
    `TypeError`. `STEPCACHE_DISABLE=1` starts the process with caching off;
    [`disabled()`][stepcache.disabled] turns it off for a block.

    Examples:
        >>> import stepcache
        >>> stepcache.set_disabled(True)
        >>> stepcache.get_disabled()
        True
        >>> stepcache.set_disabled(False)
    """
    if not isinstance(value, bool):
        raise TypeError(f"set_disabled() takes a bool (got {value!r})")
    _set(0, value)


def get_disabled() -> bool:
    """Return whether caching is off.

    It is off after `STEPCACHE_DISABLE=1`, [`set_disabled(True)`][stepcache.set_disabled]
    and within [`disabled()`][stepcache.disabled].

    Examples:
        >>> import stepcache
        >>> with stepcache.disabled():
        ...     stepcache.get_disabled()
        True
    """
    return bool(_state.switches[0])


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, decorated functions call straight through (nestable).

    Each call in the block counts as a bypass. The switch is global: other threads are
    affected too. For A/B runs and bisecting: if a bug goes away, a cache is to blame.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.disabled")
        ...     def value(self):
        ...         print("computing")
        >>> m = Meta()
        >>> with stepcache.disabled():
        ...     m.value(); m.value()
        computing
        computing
        >>> stepcache.stats()["ex.disabled"].bypasses
        2
    """
    with _switched(0, True):
        yield


def set_debug(mode: str) -> None:
    """Set the debug mode: `"off"`, `"checks"` or `"verify"`.

    `checks` validates every hit and finds stale entries, too-coarse reads and values
    used after their step; `verify` also recomputes on every hit and compares (a full
    computation per hit): see the [debug mode guide](../debug.md). Another `mode` raises
    `ValueError`. The mode is global, not per thread, and debug mode is not
    thread-safe. `STEPCACHE_DEBUG` sets it at import, [`debug()`][stepcache.debug] for a
    block.

    Examples:
        >>> import stepcache
        >>> stepcache.set_debug("checks")
        >>> stepcache.get_debug()
        'checks'
        >>> stepcache.set_debug("off")
    """
    if mode not in _state.DEBUG_MODES:
        raise ValueError(
            f"debug mode must be one of {_state.DEBUG_MODES} (got {mode!r})"
        )
    _set(1, mode)


def get_debug() -> str:
    """Return the debug mode now: `"off"`, `"checks"` or `"verify"`.

    Examples:
        >>> import stepcache
        >>> with stepcache.debug("checks"):
        ...     stepcache.get_debug()
        'checks'
    """
    return str(_state.switches[1])


@contextlib.contextmanager
def debug(mode: str = "checks") -> Iterator[None]:
    """Within the block, run in debug `mode` (nestable); default `"checks"`.

    Examples:
        >>> import stepcache
        >>> with stepcache.debug("verify"):
        ...     with stepcache.debug("checks"):
        ...         stepcache.get_debug()
        ...     stepcache.get_debug()
        'checks'
        'verify'
    """
    with _switched(1, mode):
        yield
