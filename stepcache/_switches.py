# SPDX-License-Identifier: Apache-2.0
"""Process-wide switches: ``disabled`` and the debug mode.

The hit path tests one flag, ``_state.SLOW[0]``, which is true while any switch is
on; every call then takes the slow path, which reads the switches themselves.

Like attrs' ``set_disabled``, these switches are global and not thread-local: flipping
one while other threads call decorated functions affects them too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from stepcache import _state

_lock = threading.RLock()


def _set(index: int, value: object) -> None:
    with _lock:
        _state.switches[index] = value
        _state.SLOW[0] = _state.switches[0] or _state.switches[1] != "off"


@contextlib.contextmanager
def _switched(index: int, value: Any, setter: Callable[[Any], None]) -> Iterator[None]:
    """Switch ``index`` set to ``value`` (with ``setter``) for a block, then back."""
    with _lock:
        before = _state.switches[index]
        setter(value)
    try:
        yield
    finally:
        setter(before)


def set_disabled(value: bool) -> None:
    """Turn caching off (`True`) or back on (`False`), for every decorated function.

    While off, decorated functions call straight through; each call counts as a bypass.
    The switch is global, not per thread. `STEPCACHE_DISABLE=1` starts the process with
    caching off; [`disabled()`][stepcache.disabled] turns it off for a block.

    Raises:
        TypeError: `value` is not a bool.

    Examples:
        >>> import stepcache
        >>> stepcache.set_disabled(True)
        >>> stepcache.get_disabled()
        True
        >>> stepcache.set_disabled(False)
        >>> stepcache.get_disabled()
        False
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

    For A/B runs and bisecting: if a bug goes away with caching off, a cache is to
    blame. Each call in the block counts as a bypass. The switch is global: other
    threads are affected too while the block runs.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.disabled")
        ...     def value(self):
        ...         print("computing")
        ...         return 1
        >>> m = Meta()
        >>> with stepcache.disabled():
        ...     m.value()
        ...     m.value()
        computing
        1
        computing
        1
        >>> stepcache.stats()["ex.disabled"].bypasses
        2
    """
    with _switched(0, True, set_disabled):
        yield


def set_debug(mode: str) -> None:
    """Set the debug mode: `"off"`, `"checks"` or `"verify"`.

    `checks` validates every hit and finds stale entries, too-coarse reads and values
    used after their step; `verify` also recomputes on every hit and compares (a full
    computation per hit). See the [debug mode guide](../debug.md). The mode is global,
    not per thread, and debug mode itself is not thread-safe. `STEPCACHE_DEBUG` sets
    the mode at import; [`debug()`][stepcache.debug] sets it for a block.

    Raises:
        ValueError: `mode` is not one of the three.

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
    with _switched(1, mode, set_debug):
        yield
