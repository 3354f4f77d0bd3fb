# SPDX-License-Identifier: Apache-2.0
"""The code generator: a decorated function's call, written for its own signature,
owner, key and dependencies, as attrs writes an ``__init__``.

Two versions are compiled per function: production's (a hit, and a miss that calls
the real constructors) and the slow one (every call to the slow path,
``CachedFunction.call``), which runs while caching is off or debug mode is on. A
switch that flips swaps the wrapper's code (`Compiled.use`), so no call tests a
switch. The values the code reads are its globals (``_sc_`` names, which no
parameter may have): a closure's cells would be copied into each frame. Its source is
kept in `linecache` under ``<stepcache generated NAME #ID>``, for tracebacks, pdb and
`inspect.getsource`; `stepcache.generated_source` returns it.
"""

from __future__ import annotations

import inspect
import linecache
import types
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from stepcache import _debug
from stepcache._bypass import BYPASS
from stepcache._entry import Entry
from stepcache._kinds import QUICK, VAL, VALUE_CLASSES, inference_fingerprint, match
from stepcache._scope import innermost, miss_store
from stepcache._spec import quick
from stepcache._store import NO_KEY, NO_STORE, StepCache

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction

_EMPTY = inspect.Parameter.empty
#: how a parameter of each kind is passed on (to the function, or its key function),
#: by its `inspect.Parameter.kind`, whose order is documented: positional-only,
#: positional-or-keyword, ``*args``, keyword-only, ``**kwargs``
_PASS: tuple[str, ...] = ("{}", "{}", "*{}", "{0}={0}", "**{}")


class _Default(str):
    """A default value, written in the signature as the name of the global holding
    it."""

    __repr__ = str.__str__


def signature(params: Sequence[inspect.Parameter]) -> str:
    """``params`` as the text of a ``def``'s parameters, without annotations; a
    default is the global ``_sc_D_{name}`` (`defaults` gives them)."""

    def plain(p: inspect.Parameter) -> inspect.Parameter:
        default = p.default if p.default is _EMPTY else _Default(f"_sc_D_{p.name}")
        return p.replace(annotation=_EMPTY, default=default)

    return str(inspect.Signature([plain(p) for p in params]))[1:-1]


def defaults(params: Sequence[inspect.Parameter]) -> dict[str, object]:
    """The globals `signature`'s defaults name."""
    return {f"_sc_D_{p.name}": p.default for p in params if p.default is not _EMPTY}


def passed(params: Sequence[inspect.Parameter]) -> str:
    """The arguments of a call that passes each of ``params`` on, by its name."""
    return ", ".join(_PASS[p.kind].format(p.name) for p in params)


def _code(label: str, text: str) -> types.CodeType:
    """``text`` compiled as the file ``label`` of tracebacks, its text kept in
    `linecache`."""
    linecache.cache[label] = (len(text), None, text.splitlines(True), label)
    return compile(text, label, "exec")


def _function(head: str, body: Sequence[str]) -> str:
    """The text of the function ``def {head}:`` with the lines of ``body``."""
    return f"def {head}:\n" + "".join(f"    {line}\n" for line in body)


def method(label: str, head: str, body: Sequence[str], names: dict[str, object]) -> Any:
    """The function ``def {head}:`` with the lines of ``body``, which read ``names``."""
    namespace = dict(names)
    exec(_code(label, _function(head, body)), namespace)
    return namespace[head.split("(", 1)[0]]


#: the versions of a call: production's, debug mode's, caching off's
VARIANTS = ("production", "debug", "disabled")


def source(
    fn: CachedFunction, name: str, variant: str, values: dict[str, object]
) -> str:
    """The source of ``fn``'s call, a function ``name``, in one of `VARIANTS`: debug
    mode's finds a hit as production's does and hands it to its observer
    (`stepcache._debug.hit`); its misses take the slow path. The values it
    reads besides `_globals` go to ``values``."""

    def local(base: str) -> str:  # a local name no parameter has
        while base in fn.index:
            base += "_"
        return base

    def unchanged(x: str, o: str, v: str) -> str:  # still the object o, or `match`es
        return f"({QUICK.format(x=x, o=o, v=v)} or _sc_match({x}, {o}, {v}))"

    owner, head = fn.owner_name, f"{name}({signature(fn.params)})"
    packed = "(" + "".join(f"{n}, " for n in fn.names) + ")"
    s, e, w, r, h = local("s"), local("e"), local("w"), local("r"), local("hit")
    if variant == "disabled":  # every call computes, uncached
        body = ["_sc_counts.bypasses += 1", f"return _sc_fn({passed(fn.params)})"]
        return _function(head, body)
    out, key = [], "_sc_NO_KEY"
    if fn.only:  # a value it leaves out is a bypass
        skip = local("skip")
        outside = " or ".join(f"{n} not in _sc_only_{i}" for i, n in enumerate(fn.only))
        out += ["try:", f"    {skip} = {outside}", "except _sc_Exception:"]
        out += [f"    return _sc_call({packed})", f"if {skip}:"]
        out += [f"    return _sc_call({packed}, _sc_BYPASS)"]
    if fn.key_fn is not None:  # called once; what it raises is chained once
        key, exc = local("k"), local("exc")
        out += ["try:", f"    {key} = _sc_key({passed(fn.params)})"]
        out += [f"except _sc_Exception as {exc}:"]
        out += [f"    raise _sc_key_error({exc}) from {exc}"]
        out += [f"if {key} is _sc_BYPASS:", f"    return _sc_call({packed}, {key})"]
    elif fn.key_names:
        names = fn.key_names
        key = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    slow = f"return _sc_call({packed}, {key})"
    xs = [local(f"x{i}") for i in range(len(fn.dep_names))]
    lookup = f".get({fn.fid}, _sc_EMPTY).get({key})" if fn.keyed else f".get({fn.fid})"
    # An owner without a store holds the placeholder: it looks in the open scope's
    # table (`stepcache._scope.innermost`; none open: the placeholder's, empty).
    out += ["try:", f"    {s} = {owner}._stepcache"]
    for x, d in zip(xs, fn.dep_names, strict=True):  # a parameter, or the owner's
        out.append(f"    {x} = {d if d in fn.index else f'{owner}.{d}'}")
    out += [f"    if {s} is _sc_NO_STORE:", f"        {s} = _sc_innermost()"]
    out += [f"    {e} = {s}.table{lookup}", f"    if {e} is not None:"]
    # an entry without dependencies serves only its owner (`Entry.bound`)
    tests = [] if xs else [f"{e}.bound is {owner}.__weakref__"]
    if xs:
        prints = [(local(f"o{i}"), local(f"v{i}")) for i in range(len(xs))]
        unpack = ", ".join(f"{o}, {v}" for o, v in prints)
        out.append(f"        {unpack} = {e}.deps")
        tests += [unchanged(x, o, v) for x, (o, v) in zip(xs, prints, strict=True)]
    if fn.guard:  # no tensor of the result was written since it was stored
        tests.append(f"{e}.guard._version == {e}.gtag")
    hit = ["_sc_counts.hits += 1", f"return {e}.value"]
    if variant == "debug":  # its observer checks the hit, outside the try
        out.insert(0, f"{h} = None")
        hit = [f"{h} = {e}"]
    if fn.of_args is not None:  # what expect reads of the arguments (`_spec.quick`:
        # its plain case inline): other objects are checked; a value they fail is the
        # slow path's to report
        same = " and ".join(f"{n} is {e}.args[{i}]" for i, n in enumerate(fn.arg_refs))
        plain = quick(fn.of_args, f"{e}.value", owner, values)
        fits = f"({same} or {plain} or _sc_args_ok({e}.value, {packed}))"
        if variant == "debug":
            tests.append(fits)
        else:
            hit = [f"if {fits}:", *(f"    {x}" for x in hit), f"{s} = None"]
    out += [f"        if {' and '.join(tests)}:", *(f"            {x}" for x in hit)]
    out += ["except _sc_Exception:", f"    {s} = None"]
    if variant == "debug":
        out += [f"if {h} is not None and {s} is not None:"]
        moved = "None"  # debug mode's own entry: its observer tests them
        if fn.ignored:  # each ignored argument still the object recorded (`QUICK`)
            info, moved, at = local("info"), local("moved"), local("at")
            out += [f"    {moved} = False", f"    {info} = {h}.info"]
            # each ignored argument's (position in the call, print)
            pairs = [(local(f"io{j}"), local(f"iv{j}")) for j in range(len(fn.ignored))]
            unpack = "".join(f"({at}, {o}, {v}), " for o, v in pairs)
            kept = [unchanged(n, *p) for n, p in zip(fn.ignored, pairs, strict=True)]
            out += [f"    if {info} is not None:", f"        {unpack}= {info}.ignored"]
            out += [f"        {moved} = not ({' and '.join(kept)})"]
        observed = f"_sc_observed(_sc_self, {packed}, {key}, {h}, {s}, {moved})"
        return _function(head, [*out, f"    return {observed}", slow])
    out += [f"if {s} is None:", f"    {slow}"]
    # the miss: into the owner's own store, a new one or the open scope's
    # an owner's first miss (its class holds the placeholder, no scope is open): a
    # store of its own, past a frozen class's __setattr__
    out += [f"if {s} is _sc_NO_STORE:", f"    {w} = _sc_StepCache({owner})"]
    out += ["    try:", f"        if {owner}.__class__.__setattr__ is _sc_setattr:"]
    out += [f"            {owner}._stepcache = {w}"]  # a plain class: no call
    out += ["        else:", f"            _sc_setattr({owner}, '_stepcache', {w})"]
    out += ["    except _sc_Exception:", f"        {w} = None"]
    out += ["else:", f"    {w} = _sc_miss_store({s}, {owner})"]
    out += [f"if {w} is None:", f"    {slow}"]
    fps = [local(f"f{i}") for i in range(len(xs))]
    for i, (x, f) in enumerate(zip(xs, fps, strict=True)):  # a tensor's version inline
        out += [f"if {x}.__class__ is _sc_Tensor and not {x}.is_inference():"]
        out += [f"    {f} = ({x}, {x}._version)", f"elif {x}.__class__ is _sc_Tensor:"]
        out += [f"    {f} = _sc_inference_print({x}, {w}.scope is not None)"]
        out += [f"elif {x}.__class__ in _sc_VALUE_CLASSES:"]
        out += [f"    {f} = ({x}, _sc_VAL)", "else:"]
        out += [f"    {f} = _sc_fingerprint({i}, {x}, {w})"]
    deps = fps[0] if len(fps) == 1 else "(" + "".join(f"*{f}, " for f in fps) + ")"
    out += [f"{r} = _sc_fn({passed(fn.params)})"]
    if fn.expect is not None:  # its plain case inline; the full check says why
        ok = local("ok")
        out += ["try:", f"    {ok} = {quick(fn.expect, r, owner, values)}"]
        out += ["except _sc_Exception:", f"    {ok} = False"]
        out += [f"if not {ok}:", f"    _sc_validate({r}, {packed}, {key})"]
    extra = ", True" if fn.guard else ""  # Entry's guard, then its info and args
    if fn.arg_refs:
        extra = f", {fn.guard}, None, (" + "".join(f"{n}, " for n in fn.arg_refs) + ")"
    entry = f"_sc_Entry({r}, {owner}, {deps}{extra})"
    # a store made above is open, empty and replaces no entry: its first entry is
    # one write (into `_store.CLOSED`, which drops it, if the store was closed since)
    slot = f"{{{key}: {entry}}}" if fn.keyed else entry
    out += [f"if {s} is _sc_NO_STORE:", f"    {w}.table[{fn.fid}] = {slot}"]
    out += [f"elif {w}.put({fn.fid}, {key}, {entry}, {e}):"]
    out += ["    _sc_counts.invalidations += 1"]
    return _function(head, [*out, "_sc_counts.misses += 1", f"return {r}"])


#: what the generated code reads of the decorated function, each as ``_sc_{name}``:
#: the function itself, its counts, and the slow path's methods it calls
_READ = ("fn", "counts", "call", "key_error", "args_ok", "validate", "fingerprint")


def _globals(fn: CachedFunction) -> dict[str, object]:
    """The values the generated code reads, by name."""
    return {
        **{f"_sc_{name}": getattr(fn, name) for name in _READ},
        # debug mode's observer of a hit, and the function it observes
        "_sc_observed": _debug.hit,
        "_sc_self": fn,
        "_sc_key": fn.key_fn,
        "_sc_NO_STORE": NO_STORE,
        "_sc_NO_KEY": NO_KEY,
        "_sc_EMPTY": {},  # never written: the table of a keyed function not called yet
        "_sc_BYPASS": BYPASS,
        "_sc_innermost": innermost,
        "_sc_StepCache": StepCache,
        "_sc_setattr": object.__setattr__,
        "_sc_miss_store": miss_store,
        "_sc_Entry": Entry,
        "_sc_Tensor": torch.Tensor,
        "_sc_match": match,
        "_sc_inference_print": inference_fingerprint,
        "_sc_VALUE_CLASSES": VALUE_CLASSES,
        "_sc_VAL": VAL,
        "_sc_int": int,  # builtins by _sc_ names: a parameter may be called `int`
        "_sc_Exception": Exception,
        **defaults(fn.params),
        **{f"_sc_only_{i}": allowed for i, allowed in enumerate(fn.only.values())},
    }


class Compiled:
    """A decorated function's generated call: ``wrapper``, which runs the code of
    one of `VARIANTS` (`use`). The variants are one text, one `linecache` entry."""

    def __init__(self, fn: CachedFunction) -> None:
        name = getattr(fn.fn, "__name__", "")
        # its name is a global of its namespace: none of the values it reads
        name = name if name.isidentifier() and not name.startswith("_sc_") else "call"
        self.label = f"<stepcache generated {fn.name} #{fn.fid}>"
        # a factory's functions come and go: their source goes with them
        weakref.finalize(self, linecache.cache.pop, self.label, None).atexit = False
        names = _globals(fn)
        sources = [source(fn, name, v, names) for v in VARIANTS]
        self.source = sources[0]
        module = _code(self.label, "\n".join(sources))
        # each def's code, in order; the name ends bound to the last def
        codes = [c for c in module.co_consts if isinstance(c, types.CodeType)]
        self._codes = dict(zip(VARIANTS, codes, strict=True))
        exec(module, names)
        self.wrapper: Callable[..., Any] = names[name]  # type: ignore[assignment]

    def use(self, variant: str) -> None:
        """Run the code of ``variant``, one of `VARIANTS`."""
        self.wrapper.__code__ = self._codes[variant]
