# SPDX-License-Identifier: Apache-2.0
"""Environment variables read by stepcache, once, when :mod:`stepcache` is imported."""

from __future__ import annotations

import os

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
