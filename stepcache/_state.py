# SPDX-License-Identifier: Apache-2.0
"""The core's shared state, a leaf module: the environment variables (read once, at
import), `BYPASS`, the switches and the registry."""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction


DEBUG_MODES = ("off", "checks", "verify")
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value not in _ON and value not in _OFF:
        raise ValueError(f"{name} must be 0 or 1 (got {os.environ[name]!r})")
    return value in _ON if value else default


def parse_debug_mode(raw: str, *, source: str = "debug mode") -> str:
    """Map ``raw`` to a debug mode; ``"1"`` means ``"checks"``, ``"0"`` or ``""``
    ``"off"``."""
    value = raw.strip().lower()
    mode = "off" if value in _OFF else "checks" if value in _ON else value
    if mode not in DEBUG_MODES:
        raise ValueError(f"{source} must be one of {DEBUG_MODES} or 0/1 (got {raw!r})")
    return mode


#: ``STEPCACHE_DISABLE=1``: every decorated function calls straight through.
STEPCACHE_DISABLE: bool = _flag("STEPCACHE_DISABLE", False)
#: ``STEPCACHE_DEBUG=checks|verify|1``: start in that debug mode.
STEPCACHE_DEBUG: str = parse_debug_mode(
    os.environ.get("STEPCACHE_DEBUG", ""), source="STEPCACHE_DEBUG"
)
#: ``STEPCACHE_DEBUG_GUARD=0``: debug mode hands out plain tensors, not guarded views.
STEPCACHE_DEBUG_GUARD: bool = _flag("STEPCACHE_DEBUG_GUARD", True)


class _Bypass:
    """The key that means "compute, don't cache"."""

    def __repr__(self) -> str:
        return "stepcache.BYPASS"

    def __reduce__(self) -> str:
        return "BYPASS"  # pickles and copies as this module's BYPASS itself


BYPASS: Final = _Bypass()
"""Returned by a key function: compute the value and do not cache it.

A call whose key is `BYPASS` runs the function every time and counts as a *bypass* in
[`stats()`][stepcache.stats]. Use it for the calls whose value must not be shared:
DeepSeek V4's C4A layers read their own top-k indices, so their sparse indices are
built per layer, while the SWA-only and C128A layers share one build per step.

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
    >>> stepcache.stats()["ex.sparse"].bypasses
    2
"""

#: ``[disabled, debug mode]``, set by `stepcache._switches`
switches: list[Any] = [STEPCACHE_DISABLE, STEPCACHE_DEBUG]
#: ``SLOW[0]``: a switch is on, so every call takes the slow path (the hit path's one
#: read: a list item is the cheapest mutable global)
SLOW: list[bool] = [switches[0] or switches[1] != "off"]

#: a new function's id: 1, 2, ...
new_id = itertools.count(1).__next__
_by_id: weakref.WeakValueDictionary[int, CachedFunction] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def register(fn: CachedFunction) -> None:
    with _lock:
        _by_id[fn.fid] = fn


def all_functions() -> list[CachedFunction]:
    with _lock:
        return sorted(_by_id.values(), key=lambda f: f.fid)


def name_of(fid: int) -> str:
    fn = _by_id.get(fid)
    return fn.name if fn is not None else f"<function #{fid}>"
