# SPDX-License-Identifier: Apache-2.0
"""Resolve profiler targets ("module", "module:attr", objects) to the places they are
stored, so they can be wrapped there and put back.

A target is one of:

* ``"pkg.mod"`` or a module object: every function defined in the module and every
  method (plain, static, class) of every class defined in it; dunder methods,
  properties and names imported from elsewhere are left alone;
* ``"pkg.mod:Class"`` or a class: every method the class itself defines;
* ``"pkg.mod:func"``, ``"pkg.mod:Class.method"`` or the function itself;
* ``"pkg.mod:*Builder.build"``: the attribute path may use shell wildcards
  (``*``, ``?``, ``[...]``) in each part; a pattern passes over what is not callable
  and, in a module, the names the module imported.

A module-level function is also wrapped wherever another loaded module bound it by
``from pkg.mod import func``: those aliases are found by scanning ``sys.modules`` once.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
import inspect
import sys
from collections.abc import Callable, Iterable
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

import attrs

from stepcache.profiler._errors import (
    TargetError,
    TargetNotCallableError,
    TargetNotFoundError,
)

__all__ = ["Site", "Target", "add_aliases", "resolve", "resolve_all"]

_WILD = "*?["


@attrs.frozen
class Site:
    """One place a callable is stored: the attribute ``attr`` of ``container`` (a
    module or a class), holding ``raw`` (the function, or its staticmethod /
    classmethod wrapper)."""

    container: Any = attrs.field(eq=False)
    attr: str
    raw: Any = attrs.field(eq=False)
    #: identity of the container, for equality and hashing
    cid: int = attrs.field(init=False)

    @cid.default
    def _cid(self) -> int:
        return id(self.container)


@attrs.define
class Target:
    """One callable to wrap, with every place it is stored (its home first)."""

    #: ``"module:Qual.name"``
    name: str
    #: the callable itself (for a static or class method: the function inside)
    function: Callable[..., Any]
    #: ``function``, ``method``, ``staticmethod``, ``classmethod`` or ``callable``
    kind: str
    sites: list[Site]


def resolve_all(specs: Iterable[Any]) -> list[Target]:
    """Every target the specs name, each once: by home site, and by function (another
    name of the function, ``make = build``, is a site of the target named as defined,
    not a second target wrapping the first's wrapper)."""
    seen: dict[tuple[int, str], Target] = {}
    for spec in specs:
        for target in resolve(spec):
            home = target.sites[0]
            seen.setdefault((home.cid, home.attr), target)
    named: dict[int, Target] = {}
    for t in seen.values():
        defined_as = getattr(t.function, "__name__", None)
        if id(t.function) not in named or t.sites[0].attr == defined_as:
            named[id(t.function)] = t
    out = []
    for t in seen.values():
        if (kept := named[id(t.function)]) is t:
            out.append(t)
        else:
            kept.sites.extend(s for s in t.sites if s not in kept.sites)
    return out


def resolve(spec: Any) -> list[Target]:
    """The targets one spec names (see the module docstring)."""
    if isinstance(spec, str):
        return _resolve_string(spec)
    if isinstance(spec, ModuleType):
        return _module_targets(spec)
    if isinstance(spec, type):
        return _class_targets(spec)
    if isinstance(spec, MethodType):
        spec = spec.__func__
    if isinstance(spec, (staticmethod, classmethod)):
        spec = spec.__func__
    if isinstance(spec, (FunctionType, BuiltinFunctionType)):
        return [_home_of(spec)]
    if callable(spec):
        raise TargetError(
            f"target {spec!r} is a callable object, which the profiler cannot find a "
            "home for: name it as 'module:attr' where it is stored"
        )
    raise TargetNotCallableError(
        f"target {spec!r} is a {type(spec).__name__}, not a module, class, function "
        "or 'module:attr' string"
    )


def _resolve_string(spec: str) -> list[Target]:
    module_name, _, path = spec.partition(":")
    if not module_name or (":" in spec and not path):
        raise TargetNotFoundError(
            f"target {spec!r}: expected 'package.module' or 'package.module:attr'"
        )
    module = _import(module_name, spec)
    if not path:
        return _module_targets(module)
    parts = path.split(".")
    found = _walk(module, module_name, parts, spec)
    if any(c in parts[-1] for c in _WILD):
        # A pattern takes the callables it matches and passes over the rest, and in a
        # module only what the module defines (not the names it imports).
        found = [
            f
            for f in found
            if (_unwrap(f[2], True)[0] or isinstance(f[2], type))
            and (
                isinstance(f[0], type)
                or getattr(f[2], "__module__", None) == module_name
            )
        ]
        if not found:
            raise TargetNotFoundError(
                f"target {spec!r}: the pattern {parts[-1]!r} matches no function, "
                "method or class"
            )
    targets: list[Target] = []
    for container, attr, raw, qualname in found:
        targets.extend(_targets_of(container, attr, raw, module_name, qualname, spec))
    return targets


def _import(module_name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if (
            missing
            and module_name != missing
            and not module_name.startswith(missing + ".")
        ):
            raise  # the module exists; something it imports does not
        hint = ""
        if "." in module_name and ":" not in spec:
            head, _, tail = module_name.rpartition(".")
            hint = f" (an attribute of a module is written '{head}:{tail}')"
        raise TargetNotFoundError(
            f"target {spec!r}: no module named {module_name!r}{hint}"
        ) from exc


def _walk(
    module: ModuleType, module_name: str, parts: list[str], spec: str
) -> list[tuple[Any, str, Any, str]]:
    """(container, attr, raw value, qualname) for each match of the dotted path."""
    level: list[tuple[Any, str]] = [(module, "")]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        nxt: list[tuple[Any, str]] = []
        found: list[tuple[Any, str, Any, str]] = []
        for container, prefix in level:
            names = _names(container)
            if any(c in part for c in _WILD):
                hits = [n for n in names if fnmatch.fnmatchcase(n, part)]
            else:
                hits = [part] if part in names else []
            for name in hits:
                raw = _raw(container, name)
                qual = f"{prefix}.{name}" if prefix else name
                if last:
                    found.append((container, name, raw, qual))
                elif isinstance(raw, type):
                    nxt.append((raw, qual))
        if last:
            if not found:
                raise TargetNotFoundError(_not_found(spec, module_name, parts, level))
            return found
        if not nxt:
            raise TargetNotFoundError(
                _not_found(spec, module_name, parts[: i + 1], level)
            )
        level = nxt
    raise AssertionError("unreachable")  # pragma: no cover


def _names(container: Any) -> list[str]:
    if isinstance(container, type):
        return [n for n in container.__dict__ if not _dunder(n)]
    return list(vars(container))


def _raw(container: Any, name: str) -> Any:
    if isinstance(container, type):
        return container.__dict__[name]
    return vars(container)[name]


def _not_found(
    spec: str, module_name: str, parts: list[str], level: list[tuple[Any, str]]
) -> str:
    where = ", ".join(
        f"'{module_name}:{prefix}'" if prefix else f"module '{module_name}'"
        for _, prefix in level
    )
    names = sorted({n for container, _ in level for n in _names(container)})
    close = difflib.get_close_matches(parts[-1], names, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    return f"target {spec!r}: {where} has no attribute matching {parts[-1]!r}{hint}"


def _targets_of(
    container: Any, attr: str, raw: Any, module_name: str, qualname: str, spec: str
) -> list[Target]:
    if isinstance(raw, type):
        return _class_targets(raw)
    if isinstance(raw, ModuleType):
        return _module_targets(raw)
    kind, function = _unwrap(raw, isinstance(container, type))
    if kind is None:
        what = "a property" if isinstance(raw, property) else f"a {type(raw).__name__}"
        raise TargetNotCallableError(
            f"target {spec!r} is {what}, not a function, method or class: the "
            "profiler wraps callables (for a property, name the function it calls)"
        )
    return [
        Target(
            f"{module_name}:{qualname}", function, kind, [Site(container, attr, raw)]
        )
    ]


def _unwrap(raw: Any, in_class: bool) -> tuple[str | None, Any]:
    if isinstance(raw, staticmethod):
        return "staticmethod", raw.__func__
    if isinstance(raw, classmethod):
        return "classmethod", raw.__func__
    if isinstance(raw, FunctionType):
        return ("method" if in_class else "function"), raw
    if isinstance(raw, (property, type)) or not callable(raw):
        return None, raw
    return "callable", raw


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _module_targets(module: ModuleType) -> list[Target]:
    out: list[Target] = []
    name = module.__name__
    for attr, raw in list(vars(module).items()):
        if _dunder(attr) or getattr(raw, "__module__", None) != name:
            continue
        if isinstance(raw, type):
            out.extend(_class_targets(raw))
        elif isinstance(raw, FunctionType) and "<locals>" not in raw.__qualname__:
            out.append(
                Target(f"{name}:{attr}", raw, "function", [Site(module, attr, raw)])
            )
    return out


def _class_targets(cls: type) -> list[Target]:
    out: list[Target] = []
    for attr, raw in list(cls.__dict__.items()):
        if _dunder(attr):
            continue
        kind, function = _unwrap(raw, True)
        if kind in ("method", "staticmethod", "classmethod"):
            out.append(
                Target(
                    f"{cls.__module__}:{cls.__qualname__}.{attr}",
                    function,
                    str(kind),
                    [Site(cls, attr, raw)],
                )
            )
    return out


def _home_of(fn: Any) -> Target:
    module_name = str(getattr(fn, "__module__", None) or "")
    qualname = str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", ""))
    module = sys.modules.get(module_name)
    if module is None or "<locals>" in qualname or "<lambda>" in qualname:
        raise TargetError(
            f"target {fn!r} has no home the profiler can patch (defined in a function, "
            "or its module is not loaded): name it as 'module:attr' where it is stored"
        )
    container: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        container = _namespace(container).get(part)
        if container is None:
            break
    raw = None if container is None else _namespace(container).get(parts[-1])
    kind, function = _unwrap(raw, isinstance(container, type))
    if raw is None or kind is None or function is not fn:
        raise TargetError(
            f"target {module_name}:{qualname} is not stored under its own name "
            "(replaced, or renamed on import): name it as 'module:attr' where it is "
            "stored"
        )
    return Target(
        f"{module_name}:{qualname}", fn, kind, [Site(container, parts[-1], raw)]
    )


def _namespace(container: Any) -> dict[str, Any]:
    namespace = getattr(container, "__dict__", None)
    return dict(namespace) if namespace is not None else {}


def add_aliases(targets: list[Target]) -> None:
    """Add to each module-level function target every other module global that holds
    the same function (bound by ``from module import function``)."""
    wanted = {id(t.function): t for t in targets if t.kind in ("function", "callable")}
    if not wanted:
        return
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for attr, value in list(namespace.items()):
            target = wanted.get(id(value))
            if target is None or target.function is not value:
                continue
            if any(s.container is module and s.attr == attr for s in target.sites):
                continue
            target.sites.append(Site(module, attr, value))


def signature_of(fn: Callable[..., Any]) -> inspect.Signature | None:
    """The signature, or ``None`` for callables that do not expose one."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
