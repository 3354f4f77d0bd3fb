# SPDX-License-Identifier: Apache-2.0
"""The hit path: a short function generated per decorated function.

Specialise instead of branch: the hit is written once, at decoration time, for the
function's own signature, owner, key and dependencies, so a hit tests no option
(cachetools picks a wrapper per option the same way; attrs writes ``__init__``).
It answers a hit and a bypass, and hands every other call to ``_sc_CALL``, the
function's slow path. The values it reads are named cells of a closure (``_sc_``
names, which no parameter may have), and its source is registered in `linecache`,
so tracebacks and pdb show it.
"""

from __future__ import annotations

import inspect
import linecache
from collections.abc import Callable, Sequence
from typing import Any

from stepcache._entry import CONDITION_GLOBALS, condition

__all__ = ["Hit", "compile_hit"]

P = inspect.Parameter


class Hit:
    """What the hit source needs to know about the decorated function."""

    def __init__(
        self,
        params: Sequence[inspect.Parameter],
        owner: str,
        key: tuple[str, ...] | str | None,
        deps: Sequence[tuple[str, bool]],
        guard: bool,
        only: Sequence[str],
        fid: int,
    ) -> None:
        self.params = tuple(params)
        self.owner = owner
        #: None (unkeyed), parameter names, or "callable"
        self.key = key
        #: (name, is a parameter) per dependency
        self.deps = tuple(deps)
        self.guard = guard
        self.only = tuple(only)
        self.fid = fid


def _signature(params: Sequence[inspect.Parameter]) -> str:
    parts: list[str] = []
    star = False
    for i, p in enumerate(params):
        text = p.name
        if p.kind is P.VAR_POSITIONAL:
            text, star = "*" + p.name, True
        elif p.kind is P.VAR_KEYWORD:
            text = "**" + p.name
        elif p.kind is P.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        if p.default is not P.empty:
            text += f"=_sc_D_{p.name}"
        parts.append(text)
        last = i + 1 == len(params) or params[i + 1].kind is not P.POSITIONAL_ONLY
        if p.kind is P.POSITIONAL_ONLY and last:
            parts.append("/")
    return ", ".join(parts)


def _call(params: Sequence[inspect.Parameter]) -> str:
    """The arguments that pass the parameters on by kind (for the key function)."""
    parts = []
    for p in params:
        if p.kind is P.VAR_POSITIONAL:
            parts.append("*" + p.name)
        elif p.kind is P.VAR_KEYWORD:
            parts.append("**" + p.name)
        elif p.kind is P.KEYWORD_ONLY:
            parts.append(f"{p.name}={p.name}")
        else:
            parts.append(p.name)
    return ", ".join(parts)


def source(hit: Hit, fname: str, cells: Sequence[str]) -> str:
    """The hit's source: ``_sc_make(cells...)``, which returns a function named
    ``fname`` with the decorated signature, and its counter of hits and bypasses."""
    params, owner = hit.params, hit.owner
    packed = "(" + "".join(p.name + ", " for p in params) + ")"
    out = [f"def {fname}({_signature(params)}):", "    nonlocal _sc_HITS, _sc_BYPASSES"]
    add = out.append
    add("    if _sc_SLOW[0]:")
    add(f"        return _sc_CALL({packed})")
    # a bypass needs nothing of the slow path: counted here, computed directly
    bypass = f"_sc_BYPASSES += 1; return _sc_FN({_call(params)})"
    # the function's id is a constant of the source
    lookup = f"{owner}._stepcache.table[{hit.fid}]"
    miss = f"_sc_CALL({packed})"
    key = "_sc_k"
    if hit.key == "callable":
        # a key function that raises gets its typed error from the slow path
        add("    try:")
        add(f"        _sc_k = _sc_KEY({_call(params)})")
        add("    except Exception:")
        add(f"        return _sc_CALL({packed})")
        add(f"    if _sc_k is _sc_BYPASS: {bypass}")
    elif hit.key is not None:
        key = hit.key[0] if len(hit.key) == 1 else "(" + ", ".join(hit.key) + ")"
    if hit.only:
        # an unhashable value gets its typed error from the slow path
        outside = " or ".join(f"{n} not in _sc_O_{i}" for i, n in enumerate(hit.only))
        add("    try:")
        add(f"        _sc_out = {outside}")
        add("    except Exception:")
        add(f"        return _sc_CALL({packed})")
        add(f"    if _sc_out: {bypass}")
    # The cheapest lookups there are; each finds ABSENT instead of raising where an
    # owner has no store yet (stepcache._store.NO_STORE). In a real store, a function
    # with dependencies, or keyed by kinds (only=), often misses its first lookup of a
    # step: get() there; the others subscript, and a rare miss raises.
    if hit.key is not None:
        lookup += f".get({key}, _sc_ABSENT)" if hit.only else f"[{key}]"
        miss = f"_sc_CALL({packed}, {key})"
    elif hit.deps:
        lookup = f"{owner}._stepcache.table.get({hit.fid}, _sc_ABSENT)"
    deps = [name if param else f"{owner}.{name}" for name, param in hit.deps]
    # an object's __weakref__ is its plain weak reference (where its class has no
    # such attribute, the hit misses and the slow path decides)
    lines, test = condition("_sc_e", f"{owner}.__weakref__", deps, hit.guard)
    add("    try:")
    add(f"        _sc_e = {lookup}")
    for line in lines:
        add(f"        {line}")
    add(f"        if {test}:")
    add("            _sc_HITS += 1")
    add("            return _sc_e.value")
    # anything odd (a missing attribute, a comparison that raises) is the slow path's
    add("    except Exception:")
    add("        pass")
    add(f"    return {miss}")
    # the values the hit reads are cells of a closure: cheaper than globals to read,
    # and the counts cheaper to write
    return (
        f"def _sc_make({', '.join(cells)}):\n    _sc_HITS = _sc_BYPASSES = 0\n"
        + "".join(f"    {line}\n" for line in out)
        + "    def _sc_counts(h, b):\n        nonlocal _sc_HITS, _sc_BYPASSES\n"
        + "        _sc_HITS += h\n        _sc_BYPASSES += b\n"
        + "        return _sc_HITS, _sc_BYPASSES\n"
        + f"    return {fname}, _sc_counts\n"
    )


Counts = Callable[[int, int], tuple[int, int]]


def compile_hit(
    hit: Hit, fname: str, label: str, names: dict[str, Any]
) -> tuple[Any, Counts]:
    """The hit function, closed over ``names``, and its counter (``count(h, b)`` adds
    ``h`` hits and ``b`` bypasses, and returns the two counts). Its source is kept in
    `linecache` under ``label``."""
    text = source(hit, fname if fname.isidentifier() else "wrapper", list(names))
    ns: dict[str, Any] = dict(CONDITION_GLOBALS)
    linecache.cache[label] = (len(text), None, text.splitlines(True), label)
    exec(compile(text, label, "exec"), ns)
    made: tuple[Any, Counts] = ns["_sc_make"](**names)
    return made
