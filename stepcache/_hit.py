# SPDX-License-Identifier: Apache-2.0
"""The hit path: a short function generated per decorated function, which inlines
the test that an entry serves the call (`stepcache._entry`) and hands every other call
to the slow path (``CachedFunction.call``).

As cachetools picks a wrapper per option and attrs writes ``__init__``, the hit is
written at decoration for the function's own signature, owner, key and dependencies,
so it tests no option: one line per check. The values it reads are its own globals
(``_sc_`` names, which no parameter may have; its locals get names no parameter has):
a closure's cells would be copied into the frame on every call. Its source is in
`linecache` under ``<stepcache generated hit NAME #ID>``, for tracebacks, pdb and
`inspect.getsource`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from stepcache._entry import (
    ENTRY_NAMES,
    ID,
    PLACED,
    QUICK,
    VAL,
    VALUE_CLASSES,
    Entry,
    fill_entry,
    match,
    placed,
)
from stepcache._seams import Cached
from stepcache._source import compiled, defaults, passed, signature
from stepcache._spec import Arg
from stepcache._spec_code import quick
from stepcache._state import BYPASS, NO_STORE, SLOW, innermost
from stepcache._store import INVALIDATED, STORE_NAMES, StepCache, fill_store


def source(fn: Cached, fname: str) -> str:
    """The hit's source: a function named ``fname`` with the decorated signature,
    which reads `names_of` as globals (``fn``: the `CachedFunction`)."""
    taken = set(fn.names)

    def local(name: str) -> str:  # a local name no parameter has
        while name in taken:
            name += "_"
        return name

    owner, params = fn.owner_name, fn.params
    packed = "(" + "".join(p.name + ", " for p in params) + ")"
    call = passed(params)
    e, k = local("e"), local("k")
    out = [f"def {fname}({signature(params)}):"]
    key = k
    if fn.key_fn is not None:
        # a key function that raises gets its typed error from the slow path
        out += [
            "    try:",
            f"        {k} = _sc_KEY({call})",
            "    except _sc_Exception:",
        ]
        out += [f"        return _sc_CALL({packed})"]
    elif fn.key_names:
        keys = fn.key_names
        key = keys[0] if len(keys) == 1 else "(" + ", ".join(keys) + ")"
    if fn.only:  # a value it leaves out is a bypass
        skip = local("skip")
        outside = " or ".join(f"{n} not in _sc_O_{i}" for i, n in enumerate(fn.only))
        out += ["    try:", f"        {skip} = {outside}", "    except _sc_Exception:"]
        out += [f"        return _sc_CALL({packed})", f"    if {skip}:"]
        out += [f"        return _sc_CALL({packed}, _sc_BYPASS)"]
    if fn.key_fn is not None:
        out += [f"    if {k} is _sc_BYPASS:", f"        return _sc_CALL({packed}, {k})"]
    # An owner with no store yet holds the placeholder (stepcache._state.NO_STORE):
    # inside one scope it reads the scope's store without joining it, else it has
    # none (`_state.INNERMOST`; nested scopes: the slow path joins the innermost). Where
    # the store has no entry, ``w`` says where the miss goes.
    s, w, r = local("s"), local("w"), local("r")  # store, where it misses, result
    names = [local(f"x{i}") for i in range(len(fn.dep_names))]
    stale = local("stale")  # an entry found that no longer serves
    out += [f"    {stale} = None", "    try:", f"        {s} = {owner}._stepcache"]
    for x, dep in zip(names, fn.dep_names, strict=True):
        out.append(f"        {x} = {dep if dep in fn.index else f'{owner}.{dep}'}")
    # On its own store a keyed or plain function subscripts (its hit cost, the
    # lru_cache goal; the placeholder answers a keyed one too), one with dependencies
    # gets() with the absent entry, as it often misses. An owner without a store then
    # reads the open scope's table, where a first lookup finds nothing yet: get()
    # (a keyed function's placeholder table answers every key), so no first call
    # raises. Keys of kinds (only=) often miss: get() there too.
    first = f"{s}.table.get({fn.fid}, _sc_{'KEYS' if fn.keyed else 'ABSENT'})"
    own_subscripts = fn.keyed or not fn.dep_names
    own = f"{s}.table" + (
        f"[{fn.fid}]" if own_subscripts else f".get({fn.fid}, _sc_ABSENT)"
    )
    # nothing to read: no entry, a key hashed all the same (an unhashable one raises)
    nothing = f"_sc_KEYS.get({key}, _sc_ABSENT)" if fn.keyed else "_sc_ABSENT"
    # a key of kinds (only=) often misses: get(); any other key subscripts
    by_key = f".get({key}, _sc_ABSENT)" if fn.only else f"[{key}]"
    scope_subscripts = fn.keyed and not fn.only
    if fn.keyed:
        first += by_key
        own += by_key
    tests = []
    unpack = []
    if fn.dep_names:
        pairs = [(local(f"o{i}"), local(f"v{i}")) for i in range(len(names))]
        unpack.append(", ".join(o + ", " + v for o, v in pairs) + f" = {e}.deps")
        for x, (o, v) in zip(names, pairs, strict=True):
            quick = QUICK.format(x=x, o=o, v=v)
            tests.append(f"({quick} or _sc_match({x}, {o}, {v}))")
    else:  # an entry without dependencies serves only its owner (`Entry.bound`)
        tests.append(f"{e}.bound is {owner}.__weakref__")
    if fn.guard:  # the result's tensors were not written since it was stored
        tests.append(f"{e}.guard._version == {e}.gtag")
    miss_check, hit_check = _checks(fn, r, f"{e}.value", {})
    if fn.arg_refs:  # expect's arguments: the ones it was checked against, or checked
        same = " and ".join(f"{n} is {e}.args[{i}]" for i, n in enumerate(fn.arg_refs))
        tests.append(f"({same} or {hit_check} or _sc_ARGS_OK({e}.value, {packed}))")
    # a hit in debug mode (or with caching off) is served outside the try (`served`);
    # an entry that no longer serves is ``stale`` (one whose value fails the caller's
    # arguments goes to the slow path, which says so)
    serve = [
        *unpack,
        "if (",
        *(f"    {t}" for t in tests[:1]),
        *(f"    and {t}" for t in tests[1:]),
        "):",
        "    if not _sc_SLOW[0]:",
        "        _sc_COUNTS.hits += 1",
        f"        return {e}.value",
        "else:",
        *([] if fn.arg_refs else [f"    {stale} = {e}"]),
        f"    {e} = None",
    ]

    # A subscript that finds no entry (a new key, a function with no table in the
    # store yet) is a miss too, here: its KeyError costs less than the slow path,
    # which a keyed function took on each new key. In an owner's own store only if
    # it is a store (anything else there is the slow path's), in a scope's table. A
    # lookup that only gets() cannot raise it: no handler.
    def lookup(what: str, subscripts: bool, own_store: bool) -> list[str]:
        if not subscripts:
            return [f"{e} = {what}"]
        check = [f"    if {s}.__class__ is not _sc_StepCache:", "        raise"]
        if fn.keyed:  # no table of the function: its key unhashed yet
            check.append(f"    _sc_hash({key})")
        return [
            "try:",
            f"    {e} = {what}",
            "except _sc_KeyError:",
            *(check if own_store else []),
            f"    {e} = _sc_ABSENT",
        ]

    # An owner's own store, or the open scope's table (no scope open: no entry). A
    # keyed function looks in its own store first and tests nothing before it
    # serves (its hit is the lru_cache goal; the placeholder answers too); any other
    # tests for the placeholder first, which saves an owner in a scope (the
    # plugin's calls) the placeholder's lookup.
    look = [
        f"{s} = _sc_INNERMOST()",
        f"if {s} is _sc_NO_STORE:",
        f"    {e} = {nothing}",
        "else:",
        *(f"    {x}" for x in lookup(first, scope_subscripts, False)),
    ]
    found = [f"if {e} is not _sc_ABSENT:", *(f"    {x}" for x in serve)]
    if fn.keyed:
        out += [f"        {x}" for x in (*lookup(own, own_subscripts, True), *found)]
        out += [f"        elif {s} is _sc_NO_STORE:"]
        out += [f"            {x}" for x in (*look, *found)]
    else:
        out += [f"        if {s} is not _sc_NO_STORE:"]
        out += [f"            {x}" for x in lookup(own, own_subscripts, True)]
        out += ["        else:", *(f"            {x}" for x in look)]
        out += [f"        {x}" for x in found]
    out += ["    except _sc_Exception:", f"        {e} = None"]  # the slow path judges
    key = key if fn.keyed else "None"
    # The miss in production of an owner without a store (its first call of a step),
    # or with a store of its own without the entry, or with an entry that no longer
    # serves: computed here with the dependencies read above (the slow path's `miss`
    # does the same for every other miss: a store of a copied owner, a closed one,
    # one that joins the open scope). Each fingerprint is taken before the function
    # runs.
    where = local("where")  # what the fingerprints are for: a scope's or not
    out += [
        f"    if ({e} is _sc_ABSENT or {stale} is not None) and not _sc_SLOW[0]:",
        f"        if {s} is _sc_NO_STORE:",  # no scope: a store of its own (most often)
        f"            {where}, {w} = _sc_NO_STORE, _sc_new(_sc_StepCache)",
        *(
            f"            {x}"
            for x in fill_store(w, f"_sc_id({owner})", "None", "_sc_")
        ),
        "            try:",  # past a frozen class's __setattr__ (a plain one's: quicker)
        f"                if {owner}.__class__.__setattr__ is _sc_setattr:",
        f"                    {owner}._stepcache = {w}",
        "                else:",
        f"                    _sc_setattr({owner}, '_stepcache', {w})",
        "            except _sc_Exception:",  # no room for it: the slow path says why
        f"                {w} = None",
        f"        elif {s}.__class__ is _sc_StepCache:",
        f"            {where} = _sc_NO_STORE",
        f"            {w} = {s} if (",
        f"                {s}._first == _sc_id({owner}) and {s}.scope is None",
        f"                and not {s}._closed and _sc_INNERMOST() is _sc_NO_STORE",
        "            ) else None",
        "        else:",  # the open scope's store, made at its first miss
        f"            {where}, {w} = {s}, {s}.store",
        f"        if {w} is not None:",
    ]
    prints = []
    for i, x in enumerate(names):
        f = local(f"f{i}")
        prints.append(f"*{f}")
        # a tensor, a scalar: inline (`fingerprints`' rule)
        out += [
            f"            if {x}.__class__ is _sc_Tensor:",
            f"                if not {x}.is_inference():",
            f"                    {f} = ({x}, {x}._version)",
            f"                elif {where} is not _sc_NO_STORE:",  # a scope's: itself
            f"                    {f} = ({x}, _sc_ID)",
            "                else:",  # outside a scope: its place
            "                    try:",
            f"                        {f} = {placed(x)}",
            "                    except _sc_Exception:",  # no place: `fingerprints`
            f"                        {f} = _sc_PRINT({i}, {x}, {where})",
            f"            elif {x}.__class__ in _sc_VALUE_CLASSES:",
            f"                {f} = ({x}, _sc_VAL)",
            "            else:",
            f"                {f} = _sc_PRINT({i}, {x}, {where})",
        ]
    out += [f"            {r} = _sc_FN({call})"]
    if fn.expect is not None:  # the plain case inline, the rest by the full check
        bad = local("bad")
        out += [
            "            try:",
            f"                {bad} = not {miss_check}",
            "            except _sc_Exception:",
            f"                {bad} = True",
            f"            if {bad}:",
            f"                {bad} = _sc_VIOLATION({r}, {packed})",
            f"                if {bad} is not None:",
            f"                    raise _sc_INVALID({key}, {bad})",
        ]
    args = "(" + "".join(n + ", " for n in fn.arg_refs) + ")" if fn.arg_refs else "None"
    # one dependency's fingerprint is the entry's deps as it is (one tuple fewer)
    deps = prints[0][1:] if len(prints) == 1 else "(" + ", ".join(prints) + ")"
    d, new = local("d"), local("new")  # the new entry's fingerprints, the entry
    entry = fill_entry(new, r, owner, d, str(fn.guard), "None", args, "_sc_")
    slot = f".setdefault({fn.fid}, {{}})[{key}]" if fn.keyed else f"[{fn.fid}]"
    out += [
        f"            {d}, {new} = {deps}, _sc_new(_sc_Entry)",
        *(f"            {x}" for x in entry),
        f"            {w}.table{slot} = {new}",
        f"            if {w}._closed:",  # closed while it computed (`insert`)
        f"                {w}.clear()",
        "            _sc_COUNTS.misses += 1",
        # an invalidation, unless the entry was another owner's (`find`): one call
        # counts it and the miss
        f"            if {stale} is not None and (",
        f"                {stale}.bound is None or {stale}.bound() is {owner}",
        "            ):",
        "                _sc_COUNTS.invalidations += 1",
        f"                {w}.missed({fn.fid}, _sc_INVALIDATED)",
        f"            elif {w}._counts is None:",  # the store's first miss (`missed`)
        f"                {w}._counts = {fn.fid}",
        "            else:",
        f"                {w}.missed({fn.fid})",
        f"            return {r}",
    ]
    # an entry that served, found while caching is off or debug mode is on
    out += [
        f"    if {e} is None or {e} is _sc_ABSENT:",
        f"        return _sc_CALL({packed}, {key})",
        f"    return _sc_SERVED({packed}, {key}, {e})",
    ]
    return "".join(f"{x}\n" for x in out)


def _checks(
    fn: Cached, value: str, cached: str, names: dict[str, Any]
) -> tuple[str, str]:
    """`expect`'s plain case (`stepcache._spec_code`) for the miss's ``value`` and,
    for the part that reads arguments, for a hit's ``cached`` value ("False": none);
    their values go to ``names``."""
    owner = fn.owner_name

    def ref(r: Any) -> str:
        return r.name if type(r) is Arg else f"{owner}.{r.name}"

    miss = "True" if fn.expect is None else quick(fn.expect, value, ref, names)
    hit = "False" if fn.of_args is None else quick(fn.of_args, cached, ref, names)
    return miss, hit


def names_of(fn: Cached) -> dict[str, Any]:
    """The values the hit reads, by name: its globals."""
    checks: dict[str, Any] = {}
    _checks(fn, "r", "e.value", checks)
    return {
        **checks,
        "_sc_SLOW": SLOW,
        "_sc_CALL": fn.call,
        "_sc_SERVED": fn.served,
        "_sc_ARGS_OK": fn.args_ok,
        "_sc_NO_STORE": NO_STORE,
        "_sc_INNERMOST": innermost,
        "_sc_StepCache": StepCache,
        "_sc_setattr": object.__setattr__,
        "_sc_FN": fn.fn,
        "_sc_PRINT": fn.fingerprint,
        "_sc_VIOLATION": fn.violation,
        "_sc_INVALID": fn.invalid,
        "_sc_Entry": Entry,
        "_sc_new": object.__new__,  # with the lines of __init__: no call
        **{f"_sc_{n}": v for n, v in (*ENTRY_NAMES.items(), *STORE_NAMES.items())},
        "_sc_Tensor": torch.Tensor,
        "_sc_VALUE_CLASSES": VALUE_CLASSES,
        "_sc_VAL": VAL,
        "_sc_ID": ID,
        "_sc_PLACED": PLACED,
        "_sc_KEY": fn.key_fn,
        "_sc_BYPASS": BYPASS,
        "_sc_ABSENT": fn.absent,
        "_sc_KEYS": NO_STORE.table[fn.fid] if fn.keyed else None,
        "_sc_COUNTS": fn.counts,
        "_sc_INVALIDATED": INVALIDATED,
        "_sc_match": match,
        "_sc_int": int,
        "_sc_id": id,
        "_sc_Exception": Exception,  # builtins by _sc_ names: a parameter may be `int`
        "_sc_KeyError": KeyError,
        "_sc_hash": hash,
        **defaults(fn.params),
        **{f"_sc_O_{i}": allowed for i, allowed in enumerate(fn.only.values())},
    }


def compile_hit(fn: Cached) -> Callable[..., Any]:
    """``fn``'s hit function; its source is kept in `linecache` under ``fn.label``."""
    name = getattr(fn.fn, "__name__", "")
    # its name is a global of its namespace: none of the values it reads
    fname = name if name.isidentifier() and not name.startswith("_sc_") else "wrapper"
    made: Callable[..., Any] = compiled(
        fn.label, source(fn, fname), names_of(fn), fname
    )
    return made
