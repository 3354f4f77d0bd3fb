# SPDX-License-Identifier: Apache-2.0
"""The process-wide switches (caching off, debug mode), read from the environment at
import; a switch that flips swaps every decorated function's compiled call, so that
no call tests a switch."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Final, Literal

from stepcache import _registry

DEBUG_MODES: Final = ("off", "checks", "verify")
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


class Switches:
    """The switches now; changed only by `_set`, under the registry's lock."""

    disabled: bool = _env("STEPCACHE_DISABLE", ("off", "on"), "off") == "on"
    mode: str = _env("STEPCACHE_DEBUG", DEBUG_MODES, "off")

    @classmethod
    def variant(cls) -> str:
        """Which code decorated functions run (`stepcache._codegen.VARIANTS`)."""
        if cls.disabled:
            return "disabled"
        return "production" if cls.mode == "off" else "debug"


def _set(name: Literal["disabled", "mode"], value: bool | str) -> bool | str:
    """Set the switch ``name`` to ``value``; return its value before."""
    if name == "disabled" and not isinstance(value, bool):
        raise TypeError(f"set_disabled() takes a bool (got {value!r})")
    if name == "mode" and value not in DEBUG_MODES:
        raise ValueError(f"debug mode must be one of {DEBUG_MODES} (got {value!r})")
    with _registry.lock:
        before: bool | str = getattr(Switches, name)
        setattr(Switches, name, value)
        for fn in list(_registry.by_id.values()):
            fn.compiled.use(Switches.variant())
    return before


@contextlib.contextmanager
def _switched(name: Literal["disabled", "mode"], value: bool | str) -> Iterator[None]:
    before = _set(name, value)
    try:
        yield
    finally:
        _set(name, before)


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
    _set("disabled", value)


def get_disabled() -> bool:
    """Return whether caching is off.

    Examples:
        >>> import stepcache
        >>> stepcache.get_disabled()
        False
    """
    return Switches.disabled


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
    return _switched("disabled", True)


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
    _set("mode", mode)


def get_debug() -> str:
    """Return the debug mode now: `"off"`, `"checks"` or `"verify"`.

    Examples:
        >>> import stepcache
        >>> with stepcache.debug("verify"):
        ...     stepcache.get_debug()
        'verify'
    """
    return Switches.mode


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
    return _switched("mode", mode)
