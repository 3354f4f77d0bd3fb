# SPDX-License-Identifier: Apache-2.0
"""Engine-neutral patching: wait for a module's import, check a target's shape, patch
it, undo, count, and verify against the original.

An integration with an engine (``stepcache.integrations.vllm``; SGLang would be
another) lists its :class:`Patch` objects. Each waits for its module
(:func:`when_imported`: the engine imports a model's modules only when it needs them,
long after plugins load; importing them eagerly would slow every process down), checks
the target it replaces (:func:`expect_function`, :func:`expect_dataclass_fields`;
a reshaped target raises :class:`SkipPatch` and is left alone), installs the
replacement (:func:`replace_attribute`, marked with :data:`MARK`) and returns how to
undo it. :func:`verify_against_stock` compares a patched call's value with the
original's; :data:`counters` counts events of patches whose cache is the engine's own.

>>> import sys, types
>>> seen = []
>>> cancel = when_imported("json", lambda module: seen.append(module.__name__))
>>> seen  # json is imported already, so the hook ran at once
['json']
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.abc
import importlib.machinery
import inspect
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Final

import stepcache
from stepcache import first_difference

__all__ = [
    "Hook",
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
    "expect_parameters",
    "marked",
    "pending",
    "replace_attribute",
    "replace_everywhere",
    "scoped",
    "when_imported",
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


def expect_parameters(
    owner: object, attr: str, names: Sequence[str]
) -> Callable[..., Any]:
    """``owner.attr``, which must be a plain function (not one of ours) that has the
    parameters ``names`` (others may come and go between releases). Raises
    :class:`SkipPatch` naming what is missing."""
    fn = getattr(owner, attr, None)
    where = f"{getattr(owner, '__name__', owner)}.{attr}"
    if fn is None or getattr(fn, MARK, None) is not None or not inspect.isfunction(fn):
        what = "absent" if fn is None else f"not vLLM's function ({fn!r})"
        raise SkipPatch(f"{where} is {what}")
    have = inspect.signature(fn).parameters
    if missing := [n for n in names if n not in have]:
        raise SkipPatch(f"{where} has no parameter {', '.join(missing)}")
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


def replace_everywhere(module: ModuleType, name: str, value: object) -> Undo:
    """Set ``module.name = value`` and rebind it in every imported module that bound
    the original by ``from module import name``; the returned function puts every
    binding back. (A module imported later binds the new value: the patch runs as
    ``module`` is imported, before any importer can bind its attribute.)"""
    original = getattr(module, name)
    bound = [
        m
        for m in list(sys.modules.values())
        if isinstance(m, ModuleType) and m.__dict__.get(name) is original
    ]
    undos = [replace_attribute(m, name, value) for m in bound]

    def undo() -> None:
        for each in reversed(undos):
            each()

    return undo


def scoped(
    original: Callable[..., Any], name: str, unless: str | None = None
) -> Callable[..., Any]:
    """``original`` run inside a :func:`stepcache.scope` (the lifetime it names: one
    metadata build, one draft step), unless its parameter ``unless`` is true in the
    call; each scope opened is counted as ``scopes``, each call left out as
    ``unscoped``."""
    params = list(inspect.signature(original).parameters.values())
    index = [p.name for p in params].index(unless) if unless else len(params)
    default = params[index].default if unless else None

    @functools.wraps(original)
    def in_scope(*args: Any, **kwargs: Any) -> Any:
        if unless is not None and (
            kwargs.get(unless, default) if index >= len(args) else args[index]
        ):
            counters.count(name, "unscoped")
            return original(*args, **kwargs)
        counters.count(name, "scopes")
        with stepcache.scope():
            return original(*args, **kwargs)

    return marked(in_scope, name)


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


def verified(
    name: str, cached: Callable[..., Any], original: Callable[..., Any]
) -> Callable[..., Any]:
    """What the patch ``name`` installs in place of ``original``: ``cached``, its
    step-cached stand-in, and with ``STEPCACHE_VLLM=verify`` also ``original`` on
    the same arguments, compared (:func:`verify_against_stock`). It has
    ``original``'s signature, and the module of ``cached``."""

    def patched(*args: Any, **kwargs: Any) -> Any:
        result = cached(*args, **kwargs)
        if settings.verify:
            verify_against_stock(name, result, original(*args, **kwargs))
        return result

    functools.update_wrapper(patched, original)
    patched.__module__ = cached.__module__
    return marked(patched, name)


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


# -- waiting for a module's import ----------------------------------------------------
Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
#: module name -> hooks still waiting for it
_pending: dict[str, list[Hook]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the finders after it, then wraps the loader's
    ``exec_module`` of the modules that have hooks waiting."""

    def __init__(self) -> None:
        self._busy = threading.local()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        with _lock:
            if fullname not in _pending:
                return None
        busy: set[str] = self._busy.__dict__.setdefault("names", set())
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = _find_with_others(self, fullname, path, target)
        finally:
            busy.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        inner = getattr(spec.loader, "exec_module", None)
        if inner is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            inner(module)
            _run(module.__name__, module)

        # The loader is created for this one module (FileFinder makes one per spec),
        # so wrapping its method leaves every other import alone, and the loader keeps
        # its class (code that checks isinstance(loader, SourceFileLoader) still
        # works).
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _find_with_others(
    me: _Finder,
    fullname: str,
    path: Sequence[str] | None,
    target: ModuleType | None,
) -> importlib.machinery.ModuleSpec | None:
    for finder in list(sys.meta_path):
        if finder is me:
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
        if spec is not None:
            return spec
    return None


_finder = _Finder()


def _install() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _run(name: str, module: ModuleType) -> None:
    with _lock:
        hooks = _pending.pop(name, [])
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook: Hook) -> Callable[[], None]:
    """Call ``hook(module)`` once module ``name`` is imported: now if it is already in
    ``sys.modules``, else right after its code has run. Returns a function that cancels
    the hook if it has not run yet.

    A hook that raises propagates to the importer, as an error in the module itself
    would: hooks should catch what they expect.
    """
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(hook)
            _install()
    if module is not None:
        hook(module)

    def cancel() -> None:
        with _lock:
            hooks = _pending.get(name)
            if hooks is not None and hook in hooks:
                hooks.remove(hook)
                if not hooks:
                    del _pending[name]
            if not _pending and _finder in sys.meta_path:
                sys.meta_path.remove(_finder)

    return cancel


def pending() -> list[str]:
    """The module names that hooks are still waiting for."""
    with _lock:
        return sorted(_pending)
