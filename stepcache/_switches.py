# SPDX-License-Identifier: Apache-2.0
"""Process-wide switches: ``disabled`` and the debug mode.

A switch is applied when it is flipped, not tested on every call: each decorated
function has two code objects, the fast one (production) and the switched one (disabled
or debug), and flipping a switch swaps ``__code__`` on every decorated function. The hit
path therefore pays nothing for either feature.

Like attrs' ``set_disabled``, these switches are global and not thread-local: flipping
one while other threads call decorated functions affects them too.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from stepcache import _envs
from stepcache._registry import all_functions

__all__ = [
    "debug",
    "disabled",
    "get_debug",
    "get_disabled",
    "set_debug",
    "code_name",
    "set_disabled",
]

_lock = threading.RLock()
_disabled: bool = _envs.STEPCACHE_DISABLE
_debug: str = _envs.STEPCACHE_DEBUG


def code_name() -> str:
    """Which code decorated functions run now: ``fast`` (production), ``checks``
    (debug checks: the fast lookup, then the checks) or ``switched`` (disabled, verify:
    the general slow path)."""
    if _disabled or _debug == "verify":
        return "switched"
    return "checks" if _debug == "checks" else "fast"


def _apply() -> None:
    which = code_name()
    for fn in all_functions():
        fn.use_code(which)


def set_disabled(value: bool) -> None:
    """Turn caching off (``True``) or back on, for every decorated function.

    While off, decorated functions call straight through; each call counts as a bypass.

    >>> import stepcache
    >>> stepcache.set_disabled(True); stepcache.get_disabled()
    True
    >>> stepcache.set_disabled(False); stepcache.get_disabled()
    False
    """
    global _disabled
    if not isinstance(value, bool):
        raise TypeError(f"set_disabled() takes a bool (got {value!r})")
    with _lock:
        _disabled = value
        _apply()


def get_disabled() -> bool:
    """Whether caching is off (``STEPCACHE_DISABLE=1`` or :func:`disabled`)."""
    return _disabled


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Within the block, decorated functions call straight through (nestable).

    >>> import stepcache
    >>> with stepcache.disabled():
    ...     stepcache.get_disabled()
    True
    """
    with _lock:
        before = _disabled
        set_disabled(True)
    try:
        yield
    finally:
        set_disabled(before)


def set_debug(mode: str) -> None:
    """Set the debug mode: ``"off"``, ``"checks"`` or ``"verify"`` (see the debug docs).

    >>> import stepcache
    >>> stepcache.set_debug("checks"); stepcache.get_debug()
    'checks'
    >>> stepcache.set_debug("off")
    """
    global _debug
    if mode not in _envs.DEBUG_MODES:
        raise ValueError(
            f"debug mode must be one of {_envs.DEBUG_MODES} (got {mode!r})"
        )
    with _lock:
        _debug = mode
        _apply()


def get_debug() -> str:
    """The debug mode now: ``"off"``, ``"checks"`` or ``"verify"``."""
    return _debug


@contextlib.contextmanager
def debug(mode: str = "checks") -> Iterator[None]:
    """Within the block, run in debug ``mode`` (nestable).

    >>> import stepcache
    >>> with stepcache.debug("verify"):
    ...     stepcache.get_debug()
    'verify'
    """
    with _lock:
        before = _debug
        set_debug(mode)
    try:
        yield
    finally:
        set_debug(before)
