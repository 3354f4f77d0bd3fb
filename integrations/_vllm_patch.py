# SPDX-License-Identifier: Apache-2.0
"""What a vLLM patch is, and the checks it makes before it touches anything."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

__all__ = [
    "MARK",
    "REQUIRED",
    "Patch",
    "SkipPatch",
    "Undo",
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
