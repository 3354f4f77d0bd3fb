# SPDX-License-Identifier: Apache-2.0
"""Run a function on a module as soon as it is imported (now, if it already is).

The vLLM plugin patches modules that vLLM imports only when a model needs them (the
DeepSeek V4 backends, for instance), long after plugins are loaded. Importing them
eagerly would slow down every vLLM process; instead, :func:`when_imported` waits for
the import and patches the module right after its code has run, before the importer
gets it back. A ``from module import name`` in a later module therefore already sees
the patched attribute.

>>> import sys, types
>>> seen = []
>>> cancel = when_imported("json", lambda module: seen.append(module.__name__))
>>> seen  # json is imported already, so the hook ran at once
['json']
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

__all__ = ["Hook", "pending", "when_imported"]

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
