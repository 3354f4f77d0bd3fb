# SPDX-License-Identifier: Apache-2.0
"""What a vLLM patch is, the checks it makes before it touches anything, and the
comparison with stock vLLM that ``STEPCACHE_VLLM=verify`` makes on every call."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

import stepcache
from stepcache._debug import first_difference

__all__ = [
    "MARK",
    "REQUIRED",
    "Counters",
    "Patch",
    "SkipPatch",
    "Undo",
    "counters",
    "first_difference",
    "settings",
    "verify_against_stock",
    "expect_dataclass_fields",
    "expect_function",
    "marked",
    "replace_attribute",
]

#: Set on every function the plugin installs, to the patch's name.
MARK: Final = "__stepcache_patch__"

Undo = Callable[[], None]


class SkipPatch(Exception):
    """A patch target is absent or not of the shape the patch was written for."""


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replacement of a vLLM cache or builder, applied when ``module`` is
    imported. ``apply`` checks the target, installs the replacement and returns how
    to undo it, or raises :class:`SkipPatch` with the reason it left vLLM alone."""

    name: str
    module: str
    apply: Callable[[ModuleType], Undo]


class _Required:
    def __repr__(self) -> str:
        return "<required>"


#: In an expected signature: the parameter has no default.
REQUIRED: Final = _Required()


def marked(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn``, marked as installed by the patch ``name``."""
    setattr(fn, MARK, name)
    return fn


def expect_function(
    owner: object, attr: str, params: Sequence[tuple[str, object]]
) -> Callable[..., Any]:
    """``owner.attr``, which must be a plain function (not one of ours) whose
    parameters are exactly ``params``: ``(name, default)`` pairs, ``REQUIRED`` for
    none. Raises :class:`SkipPatch` naming what differs."""
    where = f"{getattr(owner, '__name__', owner)}.{attr}"
    fn = getattr(owner, attr, None)
    if fn is None:
        raise SkipPatch(f"{where} is absent")
    if getattr(fn, MARK, None) is not None:
        raise SkipPatch(f"{where} is patched already (by {getattr(fn, MARK)!r})")
    if not inspect.isfunction(fn):
        raise SkipPatch(f"{where} is a {type(fn).__name__}, expected a function")
    got = [
        (p.name, REQUIRED if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(fn).parameters.values()
    ]
    want = list(params)
    if got != want:
        raise SkipPatch(f"{where} has parameters {_show(got)}, expected {_show(want)}")
    return fn


def _show(params: Sequence[tuple[str, object]]) -> str:
    parts = [n if d is REQUIRED else f"{n}={d!r}" for n, d in params]
    return "(" + ", ".join(parts) + ")"


def expect_dataclass_fields(cls: object, names: Sequence[str]) -> None:
    """Raise :class:`SkipPatch` unless ``cls`` is a dataclass with these fields."""
    where = getattr(cls, "__qualname__", repr(cls))
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise SkipPatch(f"{where} is not a dataclass")
    have = {f.name for f in dataclasses.fields(cls)}
    missing = [n for n in names if n not in have]
    if missing:
        raise SkipPatch(f"{where} has no field {', '.join(missing)}")


def replace_attribute(target: Any, name: str, value: object) -> Undo:
    """Set ``target.name = value``; the returned function puts back what was there
    (or removes the attribute if ``target`` did not define it itself)."""
    own = vars(target)
    had = name in own
    old = own.get(name)
    setattr(target, name, value)

    def undo() -> None:
        if getattr(target, name, None) is not value:
            return  # replaced again by someone else since: leave theirs
        if had:
            setattr(target, name, old)
        else:
            delattr(target, name)

    return undo


# -- verify mode -----------------------------------------------------------------------
class Settings:
    """What the patches read at call time (set by ``register()``)."""

    #: ``STEPCACHE_VLLM=verify``: every patched call also runs stock vLLM's code
    verify: bool = False


settings = Settings()


def verify_against_stock(name: str, ours: object, stock: object) -> None:
    """Raise :class:`stepcache.StaleCacheError` naming the patch ``name`` and the first
    difference, if ``ours`` is not what stock vLLM computed."""
    found = first_difference(stock, ours)
    counters.count(name, "verified")
    if found is not None:
        raise stepcache.StaleCacheError(
            f"stepcache verify: the patch {name} gave another value than stock "
            f"vLLM: {found}. Stock vLLM's value is the right one; turn the plugin off "
            f"(STEPCACHE_VLLM=0) and report this."
        )


# -- counters --------------------------------------------------------------------------
class Counters:
    """Per-patch event counts of this process (hits, misses, verified calls...), for
    the patches whose cache is vLLM's own (not in :func:`stepcache.stats`).

    Diagnostics, counted without a lock (a patched call should not take one): two
    threads counting the same event at once may lose one count.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def count(self, name: str, event: str) -> None:
        key = (name, event)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def to_dict(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (name, event), n in list(self._counts.items()):
            out.setdefault(name, {})[event] = n
        return out

    def reset(self) -> None:
        self._counts.clear()


counters = Counters()
