# SPDX-License-Identifier: Apache-2.0
"""The hit path: a cached value (`Entry`), the test that it serves a call
(:func:`condition`, the one dependency rule) and the short function generated per
decorated function that inlines that test.

As cachetools picks a wrapper per option and attrs writes ``__init__``, the hit is
written at decoration for the function's own signature, owner, key and dependencies,
so it tests no option. It answers a hit and a bypass and hands every other call to
``_sc_CALL``, the slow path. Its values are named cells of a closure (``_sc_`` names,
which no parameter may have); its source is in `linecache` for tracebacks and pdb.
"""

from __future__ import annotations

import inspect
import linecache
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from stepcache._fingerprint import MATCH, MATCH_GLOBALS, matches
from stepcache._state import BYPASS, SLOW

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction

P = inspect.Parameter
#: how a parameter of each kind is passed on (to the function, or its key function)
_PASS: dict[Any, str] = {
    P.VAR_POSITIONAL: "*{}",
    P.VAR_KEYWORD: "**{}",
    P.KEYWORD_ONLY: "{0}={0}",
}
Counts = Callable[[int, int], tuple[int, int]]
#: builtins by _sc_ names (`compile_hit`): a parameter may be called `Exception`
CATCH = "    except _sc_Exception:"


def condition(
    e: str, ref: str, deps: Sequence[str], guard: bool
) -> tuple[list[str], str]:
    """Source of the test that entry ``e`` serves a call: assignments of the
    dependency expressions ``deps`` to locals, and the condition over them. ``ref`` is
    the owner's plain weak reference (what ``weakref.ref(owner)`` returns).

    >>> lines, test = condition("e", "md.__weakref__", ["md.qsl"], guard=False)
    >>> lines
    ['_sc_x0 = md.qsl', '_sc_xd = e.deps']
    >>> test.startswith("((_sc_x0 is _sc_xd[0] and")
    True
    """
    lines = [f"_sc_x{i} = {expr}" for i, expr in enumerate(deps)]
    lines += ["_sc_xd = " + e + ".deps"] if deps else []
    # an entry without dependencies serves only the owner that computed it
    parts = [
        f"({MATCH.format(x=f'_sc_x{i}', o=f'_sc_xd[{2 * i}]', v=f'_sc_xd[{2 * i + 1}]')})"
        for i in range(len(deps))
    ] or [f"{e}.bound is {ref}"]
    if guard:  # the result's tensors were not written since it was stored
        parts.append(f"{e}.guard._version == {e}.gtag")
    return lines, " and ".join(parts)


class Entry:
    """One cached value: ``value``; ``bound``, a weak reference to the owner that
    computed it (an entry without dependencies serves only that owner) or ``None``;
    ``deps``, its dependencies' fingerprints, flat (``o0, v0, o1, v1, ...``);
    ``guard``/``gtag``, the result's guard (``guard_result``) or ``None``; ``info``,
    what debug mode recorded (or ``None``)."""

    __slots__ = ("bound", "deps", "gtag", "guard", "info", "value")

    def __init__(
        self,
        value: Any,
        bound: weakref.ref[Any] | None,
        deps: tuple[Any, ...],
        guard: Any = None,
        gtag: Any = None,
        info: Any = None,
    ) -> None:
        self.value, self.bound, self.deps = value, bound, deps
        self.guard, self.gtag, self.info = guard, gtag, info

    def matches(self, owner: object, xs: Sequence[Any]) -> bool:
        """Whether this entry serves a call on ``owner`` whose dependencies are ``xs``
        (:func:`condition`, called instead of inlined)."""
        d = self.deps
        if xs:
            ok = all(matches(x, d[2 * i], d[2 * i + 1]) for i, x in enumerate(xs))
        else:
            ok = self.bound is weakref.ref(owner)
        return ok and (self.guard is None or self.guard._version == self.gtag)


_NOTHING = object()
#: The entry a hit finds where there is none (see `stepcache._store.NO_STORE`): it
#: fails every :func:`condition` without raising.
ABSENT: Final = Entry(None, type(None), (_NOTHING, _NOTHING), _NOTHING, _NOTHING)  # type: ignore[arg-type]


class _Cell(str):
    """A default value, written in the signature as the name of the cell holding it."""

    def __repr__(self) -> str:
        return str(self)


def _signature(params: Sequence[inspect.Parameter]) -> str:
    plain = [
        p.replace(
            annotation=P.empty,
            default=p.default if p.default is P.empty else _Cell(f"_sc_D_{p.name}"),
        )
        for p in params
    ]
    return str(inspect.Signature(plain))[1:-1]


def source(fn: CachedFunction, fname: str, cells: Sequence[str]) -> str:
    """The hit's source: ``_sc_make(cells...)``, which returns a function named
    ``fname`` with the decorated signature, and its counter of hits and bypasses."""
    owner, fid, params = fn.owner_name, fn.fid, fn.params
    packed = "(" + "".join(p.name + ", " for p in params) + ")"
    call = ", ".join(_PASS.get(p.kind, "{}").format(p.name) for p in params)
    miss = f"_sc_CALL({packed})"
    out = [f"def {fname}({_signature(params)}):", "    nonlocal _sc_HITS, _sc_BYPASSES"]
    out += ["    if _sc_SLOW[0]:", f"        return {miss}"]

    def bypass_if(test: str, expr: str) -> None:
        # a key function or only= value that raises gets its typed error from the slow
        # path; a bypass needs nothing of it: counted here, computed directly
        out.extend(["    try:", f"        {expr}", CATCH])
        out.append(f"        return {miss}")
        out.append(f"    if {test}: _sc_BYPASSES += 1.0; return _sc_FN({call})")

    key = "_sc_k"
    if fn.key_fn is not None:
        bypass_if("_sc_k is _sc_BYPASS", f"_sc_k = _sc_KEY({call})")
    elif fn.key_names:
        names = fn.key_names
        key = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    if fn.only:
        tests = (f"{n} not in _sc_O_{i}" for i, n in enumerate(fn.only))
        bypass_if("_sc_out", "_sc_out = " + " or ".join(tests))
    # Each lookup finds ABSENT instead of raising where an owner has no store yet
    # (stepcache._store.NO_STORE). A function with dependencies, or keyed by kinds
    # (only=), often misses in a real store: get() there; the others subscript.
    lookup = f"{owner}._stepcache.table"
    if fn.keyed:
        lookup += f"[{fid}].get({key}, _sc_ABSENT)" if fn.only else f"[{fid}][{key}]"
        miss = f"_sc_CALL({packed}, {key})"
    else:
        lookup += f".get({fid}, _sc_ABSENT)" if fn.dep_names else f"[{fid}]"
    deps = [d if d in fn.index else f"{owner}.{d}" for d in fn.dep_names]
    # an object's __weakref__ is its plain weak reference (where its class has no
    # such attribute, the hit misses and the slow path decides)
    lines, test = condition("_sc_e", f"{owner}.__weakref__", deps, fn.guard)
    out += ["    try:", f"        _sc_e = {lookup}", *(f"        {x}" for x in lines)]
    out += [f"        if {test}:", "            _sc_HITS += 1.0"]
    out += ["            return _sc_e.value", CATCH, "        pass"]
    out.append(f"    return {miss}")  # anything odd is the slow path's to judge
    # cells are cheaper to read than globals; the counts are floats, whose += reuses
    # CPython's free list, where an int past 256 allocates
    counts = [
        "def _sc_counts(h, b):",
        "    nonlocal _sc_HITS, _sc_BYPASSES",
        "    _sc_HITS += h",
        "    _sc_BYPASSES += b",
        "    return int(_sc_HITS), int(_sc_BYPASSES)",
        f"return {fname}, _sc_counts",
    ]
    body = ["_sc_HITS = _sc_BYPASSES = 0.0", *out, *counts]
    return f"def _sc_make({', '.join(cells)}):\n" + "".join(f"    {x}\n" for x in body)


def compile_hit(fn: CachedFunction) -> tuple[Any, Counts]:
    """``fn``'s hit function and its counter (``counts(h, b)`` adds ``h`` hits and
    ``b`` bypasses and returns both counts); its source is kept in `linecache` under
    ``fn.label``."""
    cells = {
        "_sc_SLOW": SLOW,
        "_sc_CALL": fn.call,
        "_sc_FN": fn.fn,
        "_sc_KEY": fn.key_fn,
        "_sc_BYPASS": BYPASS,
        "_sc_ABSENT": ABSENT,
        **{f"_sc_D_{p.name}": p.default for p in fn.params if p.default is not P.empty},
        **{f"_sc_O_{i}": allowed for i, allowed in enumerate(fn.only.values())},
    }
    name = getattr(fn.fn, "__name__", "")
    text = source(fn, name if name.isidentifier() else "wrapper", list(cells))
    linecache.cache[fn.label] = (len(text), None, text.splitlines(True), fn.label)
    namespace: dict[str, Any] = {**MATCH_GLOBALS, "_sc_Exception": Exception}
    exec(compile(text, fn.label, "exec"), namespace)
    made: tuple[Any, Counts] = namespace["_sc_make"](**cells)
    return made
