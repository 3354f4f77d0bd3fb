# SPDX-License-Identifier: Apache-2.0
"""Engine-neutral patching: wait for a module's import, check a target's shape, patch
it (in a scope, compared with the original, or as is), undo, count.

An engine's plugin (:class:`stepcache.integrations.plugin.EnginePlugin`) lists its
:class:`Patch` objects. Each waits for its module (:func:`when_imported`: an engine
imports a model's modules only when it needs them, long after plugins load; importing
them eagerly would slow every process down). Its ``find`` checks the target it
replaces (:func:`expect_function`, :func:`expect_dataclass_fields`; a reshaped target
raises :class:`SkipPatch` and is left alone) and names it in a :class:`Target`; its
``wrap`` says what is installed there: the original run inside a
:func:`stepcache.scope` (:class:`InScope`), a stand-in that verify mode compares with the
original (:class:`Verify`), or the stand-in as is (:class:`Unwrapped`).
:func:`install` puts it in place, marked with :data:`MARK`, and returns how to undo
it; :data:`counters` counts events of patches whose cache is the engine's own.

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
from collections.abc import Callable, Collection, Sequence
from types import ModuleType
from typing import Any, ClassVar, Final

import stepcache
from stepcache import first_difference
from stepcache.kit import defaults, method, passed, signature

__all__ = [
    "Hook",
    "MARK",
    "REQUIRED",
    "UNWRAPPED",
    "Counters",
    "Patch",
    "InScope",
    "SkipPatch",
    "StockCheck",
    "Target",
    "Undo",
    "Unwrapped",
    "Verify",
    "Wrap",
    "counters",
    "first_difference",
    "expect_dataclass_fields",
    "expect_function",
    "expect_parameters",
    "absent",
    "install",
    "marked",
    "pending",
    "replace_attribute",
    "replace_everywhere",
    "scoped",
    "verified",
    "when_imported",
]

#: Set on every function a plugin installs, to the patch's name.
MARK: Final = "__stepcache_patch__"

Undo = Callable[[], None]


class SkipPatch(Exception):
    """A patch target is absent or not of the shape the patch was written for."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What a patch replaces, found and checked by its ``find``: ``owner.attr``
    (a module or a class), whose value is ``original``. ``stand_in`` is what a
    :class:`Verify` or :class:`Unwrapped` patch installs in its place (a
    :class:`InScope` patch wraps ``original`` itself). ``everywhere``: also rebind it in
    every module that bound it by ``from owner import attr``
    (:func:`replace_everywhere`). ``descriptor``: what the installed function is
    wrapped in on a class (``classmethod`` for a target that is one: ``original``
    and ``stand_in`` are then functions of ``(cls, ...)``)."""

    owner: Any
    attr: str
    original: Callable[..., Any]
    stand_in: Callable[..., Any] | None = None
    everywhere: bool = False
    descriptor: Callable[[Callable[..., Any]], Any] | None = None

    def the_stand_in(self, name: str) -> Callable[..., Any]:
        """``stand_in``; a patch that wraps one and found none is a bug of its own."""
        if self.stand_in is None:
            raise TypeError(f"the patch {name} found no stand-in to install")
        return self.stand_in


@dataclasses.dataclass(frozen=True)
class StockCheck:
    """Verify mode's comparison: raise :class:`stepcache.StaleCacheError` naming the
    patch and the first difference, if a patched call's value is not what stock
    ``engine`` computed. ``switch`` is how a user turns the plugin off."""

    engine: str
    switch: str

    def __call__(self, name: str, ours: object, stock: object) -> None:
        found = first_difference(stock, ours)
        counters.count(name, "verified")
        if found is not None:
            raise stepcache.StaleCacheError(
                f"stepcache verify: the patch {name} gave another value than stock "
                f"{self.engine}: {found}. Stock {self.engine}'s value is the right "
                f"one; turn the plugin off ({self.switch}) and report this."
            )


@dataclasses.dataclass(frozen=True)
class InScope:
    """Wrap the original in a :func:`stepcache.scope` (:func:`scoped`), unless its
    parameter ``unless`` is true in the call. Counted under ``count_as`` (default:
    the patch's name), so patches of one lifetime in several classes share a row."""

    kind: ClassVar[str] = "scope"
    unless: str | None = None
    count_as: str | None = None

    def build(self, name: str, target: Target, check: StockCheck | None) -> Any:
        """The function to install for the patch ``name``."""
        return marked(scoped(target.original, self.count_as or name, self.unless), name)


@dataclasses.dataclass(frozen=True)
class Verify:
    """Install the stand-in (as it is, in production); in verify mode also compute
    stock's value and compare (:func:`verified`). ``stock(*args, **kwargs)``
    computes it (default: the original on the same arguments; a stand-in that fills
    the engine's own cache needs stock on a copy that has none);
    ``when(*args, **kwargs)``, asked before the call, leaves the calls it is false for
    uncompared (those the engine's own cache answers)."""

    kind: ClassVar[str] = "verify"
    stock: Callable[..., Any] | None = None
    when: Callable[..., bool] | None = None

    def build(self, name: str, target: Target, check: StockCheck | None) -> Any:
        """The function to install for the patch ``name``."""
        stand_in = target.the_stand_in(name)
        stock = target.original if self.stock is None else self.stock
        return verified(name, stand_in, target.original, check, stock, self.when)


@dataclasses.dataclass(frozen=True)
class Unwrapped:
    """Install the stand-in as it is (marked)."""

    kind: ClassVar[str] = "none"

    def build(self, name: str, target: Target, check: StockCheck | None) -> Any:
        """The function to install for the patch ``name``."""
        return marked(target.the_stand_in(name), name)


#: How a patch is wrapped: in a scope, verified, or not at all.
Wrap = InScope | Verify | Unwrapped

UNWRAPPED: Final = Unwrapped()


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replacement in an engine, applied when ``module`` is imported. ``find``
    checks the target and returns it (:class:`Target`), or raises :class:`SkipPatch`
    with the reason it left the engine alone; ``wrap`` says what is installed there
    (:class:`InScope`, :class:`Verify` or :class:`Unwrapped`); ``opt_in``: applied only
    where the plugin's ``add_env`` names it (a cache that costs more build time than
    it saves where it was measured)."""

    name: str
    module: str
    find: Callable[[ModuleType], Target]
    wrap: Wrap = UNWRAPPED
    opt_in: bool = False


def install(patch: Patch, module: ModuleType, check: StockCheck | None) -> Undo:
    """Apply ``patch`` to its imported ``module``: find the target, build what its
    wrap installs (comparing with stock when ``check`` is given), put it in place;
    returns how to undo it. Raises :class:`SkipPatch` from ``find``."""
    target = patch.find(module)
    value = patch.wrap.build(patch.name, target, check)
    if target.descriptor is not None:
        value = target.descriptor(value)
    if target.everywhere:
        return replace_everywhere(target.owner, target.attr, value)
    return replace_attribute(target.owner, target.attr, value)


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
        what = "absent" if fn is None else f"not the engine's function ({fn!r})"
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
        # read as set (a class's classmethod, not the method it binds)
        if vars(target).get(name) is not value:
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
    original: Callable[..., Any],
    name: str,
    unless: str | None = None,
    at_most_one: str | None = None,
) -> Callable[..., Any]:
    """``original`` run inside a :func:`stepcache.scope` (the lifetime it names: one
    metadata build, one draft step), unless its parameter ``unless`` is true in the
    call or its parameter ``at_most_one`` is an int of at most 1 (a call with
    nothing to share: vLLM's build of one-token queries); each scope opened is
    counted as ``scopes``, each call left out as ``unscoped``."""
    params = list(inspect.signature(original).parameters.values())
    if any(p.name.startswith("_sc_") for p in params):  # a name of ours: not written
        raise SkipPatch(f"{original.__qualname__} has a parameter named _sc_...")
    names_in = {p.name for p in params}
    for wanted in (unless, at_most_one):
        if wanted is not None and wanted not in names_in:
            raise SkipPatch(f"{original.__qualname__} has no parameter {wanted!r}")
    # Written for the original's own signature, as the generated hit is: a wrapper
    # of *args and **kwargs would pack and unpack every argument on every build (V2's
    # build_attn_metadata is called with 17 keywords), and read two of them by name.
    skip = [unless] if unless is not None else []
    # an int of at most 1: decodes only (anything else opens the scope)
    if at_most_one is not None:
        skip += [f"({at_most_one}.__class__ is int and {at_most_one} <= 1)"]
    call = f"_sc_original({passed(params)})"
    body = []
    if skip:  # a call left out: counted, and run as it is
        body += [
            f"if {' or '.join(skip)}:",
            "    _sc_counts[_sc_left] = _sc_counts.get(_sc_left, 0) + 1",
            f"    return {call}",
        ]
    body += [
        "_sc_counts[_sc_opened] = _sc_counts.get(_sc_opened, 0) + 1",
        "with _sc_scope():",
        f"    return {call}",
    ]
    names = {
        # counted inline, in the counters' own table: this runs once per build
        "_sc_counts": counters.table(),
        "_sc_opened": (name, "scopes"),
        "_sc_left": (name, "unscoped"),
        "_sc_scope": stepcache.scope,
        "_sc_original": original,
        **defaults(params),
    }
    label = f"<stepcache scope {name}>"
    in_scope = method(label, f"in_scope({signature(params)})", body, names)
    return functools.update_wrapper(in_scope, original)


# -- verify mode -----------------------------------------------------------------------
def verified(
    name: str,
    stand_in: Callable[..., Any],
    original: Callable[..., Any],
    check: StockCheck | None,
    stock: Callable[..., Any] | None = None,
    when: Callable[..., bool] | None = None,
) -> Callable[..., Any]:
    """What the patch ``name`` installs in place of ``original``: without a
    ``check`` (production), ``stand_in`` itself (its step-cached replacement, which
    takes ``original``'s parameters); with one (verify mode), a function of
    ``original``'s signature, in the module of ``stand_in``, that also computes
    ``stock`` (default ``original``) on the same arguments and compares, for the calls
    ``when`` allows (default: every call)."""
    if check is None:
        # no pass-through call in front of the cache: the engine calls it directly
        return marked(stand_in, name)
    compute_stock = original if stock is None else stock

    def patched(*args: Any, **kwargs: Any) -> Any:
        compare = when is None or when(*args, **kwargs)
        result = stand_in(*args, **kwargs)
        if compare:
            check(name, result, compute_stock(*args, **kwargs))
        return result

    functools.update_wrapper(patched, original)
    patched.__module__ = getattr(stand_in, "__module__", original.__module__)
    return marked(patched, name)


# -- counters --------------------------------------------------------------------------
class Counters:
    """Per-patch event counts of this process (scopes, verified calls...), for the
    patches whose cache is the engine's own (not in :func:`stepcache.stats`).

    Diagnostics, counted without a lock (a patched call should not take one): two
    threads counting the same event at once may lose one count.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str], int] = {}

    def table(self) -> dict[tuple[str, str], int]:
        """The counts by ``(name, event)``, the dict itself (kept for the process's
        life: :meth:`reset` empties it), for a caller that counts inline."""
        return self._counts

    def count(self, name: str, event: str) -> None:
        key = (name, event)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1

    def to_dict(
        self, names: Collection[str] | None = None
    ) -> dict[str, dict[str, int]]:
        """The counts by name and event (only ``names``' when given)."""
        out: dict[str, dict[str, int]] = {}
        for (name, event), n in list(self._counts.items()):
            if names is None or name in names:
                out.setdefault(name, {})[event] = n
        return out

    def reset(self, names: Collection[str] | None = None) -> None:
        """Zero every count (only ``names``' when given)."""
        if names is None:
            self._counts.clear()
            return
        for key in [k for k in self._counts if k[0] in names]:
            del self._counts[key]


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


def absent(name: str) -> bool:
    """Whether module ``name`` is known not to exist: its top package is installed
    as files and the module is not among them. Imports nothing (a plugin registers
    before the engine imports its modules). Anything it cannot tell (a module made at
    run time, a package some other finder serves) counts as present, so a patch of it
    keeps waiting for its import.

    >>> absent("json.decoder"), absent("json.no_such_module"), absent("no_such_pkg.x")
    (False, True, False)
    """
    if name in sys.modules:
        return False
    top, *rest = name.split(".")
    try:
        spec = importlib.machinery.PathFinder.find_spec(top)
    except (ImportError, ValueError):
        return False
    for part in rest:
        if spec is None or spec.submodule_search_locations is None:
            return False  # not files, or a module where a package was expected
        path = list(spec.submodule_search_locations)
        spec = importlib.machinery.PathFinder.find_spec(part, path)
        if spec is None:
            return True
    return False


def pending() -> list[str]:
    """The module names that hooks are still waiting for."""
    with _lock:
        return sorted(_pending)
