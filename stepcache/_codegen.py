# SPDX-License-Identifier: Apache-2.0
"""Source generation for decorated functions.

Specialise instead of branch: the hit path of each decorated function is generated once,
at decoration time, for its own signature, owner, key form and dependencies, so a hit
tests no option. A factory closes the generated functions over their constants and the
hit counter (cells are cheaper than globals to update), and the fast and the switched
code close over the same cells, so a switch can swap ``__code__`` between them.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import attrs

from stepcache._store import ATTR

__all__ = ["Dep", "Layout", "generate"]

P = inspect.Parameter


@attrs.frozen
class Dep:
    """One declared dependency: a parameter of the call or an attribute of the owner."""

    name: str
    param: bool


@attrs.frozen
class Layout:
    """What the generated code needs to know about the decorated function."""

    params: tuple[inspect.Parameter, ...]
    owner: str
    #: None (unkeyed), a tuple of parameter names, or "callable"
    key: tuple[str, ...] | str | None
    deps: tuple[Dep, ...]
    #: re-check the versions of the result's tensors on every hit
    guard: bool = False
    #: parameters whose value must be in a collection for the call to be cached
    only: tuple[str, ...] = ()
    #: the compiled check of the function's ``expect=`` (none: empty), as lines the
    #: miss runs inline (see ``_speccheck.inline_check``)
    check: tuple[str, ...] = ()


def _signature(params: Sequence[inspect.Parameter]) -> str:
    parts: list[str] = []
    star_done = False
    for i, p in enumerate(params):
        text = p.name
        if p.kind is P.VAR_POSITIONAL:
            text = "*" + p.name
            star_done = True
        elif p.kind is P.VAR_KEYWORD:
            text = "**" + p.name
        elif p.kind is P.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.default is not P.empty:
            text += f"=_sc_D_{p.name}"
        parts.append(text)
        nxt = params[i + 1] if i + 1 < len(params) else None
        if p.kind is P.POSITIONAL_ONLY and (
            nxt is None or nxt.kind is not P.POSITIONAL_ONLY
        ):
            parts.append("/")
    return ", ".join(parts)


def _call_args(params: Sequence[inspect.Parameter], ref: dict[str, str]) -> str:
    parts = []
    for p in params:
        v = ref[p.name]
        if p.kind is P.VAR_POSITIONAL:
            parts.append("*" + v)
        elif p.kind is P.VAR_KEYWORD:
            parts.append("**" + v)
        elif p.kind is P.KEYWORD_ONLY:
            parts.append(f"{p.name}={v}")
        else:
            parts.append(v)
    return ", ".join(parts)


def _key_expr(layout: Layout, ref: dict[str, str]) -> str | None:
    if layout.key is None:
        return None
    if layout.key == "callable":
        return f"_sc_key({_call_args(layout.params, ref)})"
    names = layout.key
    assert isinstance(names, tuple)
    if len(names) == 1:
        return ref[names[0]]
    return "(" + ", ".join(ref[n] for n in names) + ")"


def _dep_expr(dep: Dep, owner: str, ref: dict[str, str]) -> str:
    return ref[dep.name] if dep.param else f"{owner}.{dep.name}"


def generate(layout: Layout) -> str:
    """Source of ``_sc_factory``, which returns the generated functions (see its return)."""
    params = layout.params
    direct = {p.name: p.name for p in params}
    packed = {p.name: f"a[{i}]" for i, p in enumerate(params)}
    sig = _signature(params)
    args_tuple = "(" + "".join(p.name + ", " for p in params) + ")"
    owner = layout.owner

    key = _key_expr(layout, direct)
    # A plain attribute read and subscripts, the cheapest lookup. An owner with no
    # store yet (a step's first call on a new metadata object) reads its class's
    # placeholder store (``_store._place``), whose lookups find an entry that fails
    # every check (``_tables``) instead of raising: a caught exception costs about ten
    # microseconds with the CPU's caches cold. A function with dependencies (the first
    # call on a store that another function made, typically) also finds that entry
    # where its store has none (``_sc_X[7]``): a get() costs a few nanoseconds more
    # than a subscript, small beside its dependency checks. A keyed function with
    # only= also uses get(): its calls come in kinds, each cached kind a key of its
    # own, so at every step a real store misses the key of each kind after the first
    # (measured on the DSv4 step of 8 layers, its sparse index alone: 0.7% less time).
    # Any other keyed or bound function keeps the subscript, and a missing entry in a
    # real store raises (the hit is what they are measured by).
    lookup = f"{owner}.{ATTR}._e[_sc_FID]"
    if key is not None and layout.only:
        lookup += ".get(_sc_k, _sc_X[7])"
    elif key is not None:
        lookup += "[_sc_k]"
    elif layout.deps:
        lookup = f"{owner}.{ATTR}._e.get(_sc_FID, _sc_X[7])"

    # Every check runs inside the try, so a missing attribute or an odd comparison sends
    # the call to the slow path, which raises a typed error. The checks nest: the hit
    # statement runs only when the entry, every dependency and the result guard match.
    lines = [f"_sc_e = {lookup}"]
    indent = ""
    for i, dep in enumerate(layout.deps):
        o, v = f"_sc_e[{2 + 2 * i}]", f"_sc_e[{3 + 2 * i}]"
        lines += [
            f"{indent}_sc_x = {_dep_expr(dep, owner, direct)}",
            f"{indent}_sc_v = {v}",
            f"{indent}if (_sc_x is {o} and (_sc_v.__class__ is not int"
            " or _sc_x._version == _sc_v))"
            f" or (_sc_v is _sc_X[3] and _sc_x.__class__ is {o}.__class__"
            f" and _sc_x == {o})"
            f" or (_sc_v is _sc_X[4] and _sc_X[5](_sc_x) == {o}):",
        ]
        indent += "    "
    if not layout.deps:
        lines.append(f"if _sc_e[1]() is {owner}:")
        indent += "    "
    if layout.guard:
        # A result that is a view into a persistent buffer goes stale when the buffer
        # is written again (its version counter, shared with the buffer, moves on).
        # The entry holds the result's tensor and its version (or, for several
        # tensors, a TensorVersions whose _version reads them all).
        g = 2 + 2 * len(layout.deps)
        lines.append(f"{indent}if _sc_e[{g}]._version == _sc_e[{g + 1}]:")
        indent += "    "

    def matched(hit: list[str]) -> str:
        body = lines + [indent + h for h in hit]
        return (
            "        try:\n"
            + "".join(f"            {line}\n" for line in body)
            + "        except Exception:\n"
            "            pass\n"
        )

    keyof = _key_expr(layout, packed)
    if layout.only:
        outside = " or ".join(
            f"{packed[n]} not in _sc_O_{i}" for i, n in enumerate(layout.only)
        )
        keyof = f"_sc_BYPASS if {outside} else {keyof}"
    dep_values = (
        "("
        + "".join(
            _dep_expr(d, f"a[{_index(params, owner)}]", packed) + ", "
            for d in layout.deps
        )
        + ")"
    )

    # A keyed function computes its key once: a BYPASS key calls straight through (no
    # failed lookup, no second key call), and a miss hands the key to the slow path.
    prologue = ""
    miss_call = f"_sc_X[0]({args_tuple})"
    if layout.only:
        # a call outside only= computes without caching; a value that cannot be
        # looked up (unhashable) goes to the slow path, which raises a typed error
        outside = " or ".join(
            f"{direct[n]} not in _sc_O_{i}" for i, n in enumerate(layout.only)
        )
        prologue += (
            "        try:\n"
            f"            _sc_out = {outside}\n"
            "        except Exception:\n"
            f"            return _sc_X[0]({args_tuple})\n"
            "        if _sc_out:\n"
            "            _sc_bypasses += 1\n"
            f"            return _sc_f({_call_args(params, direct)})\n"
        )
    if key is not None:
        if layout.key == "callable":
            # the slow path calls the key function again and raises a typed error
            prologue += (
                "        try:\n"
                f"            _sc_k = {key}\n"
                "        except Exception:\n"
                f"            return _sc_X[0]({args_tuple})\n"
            )
        else:
            prologue += f"        _sc_k = {key}\n"
        if layout.key == "callable":
            # (a parameter's value as the key is not tested here: the rare BYPASS
            # passed as an argument bypasses through the slow path)
            prologue += (
                "        if _sc_k is _sc_BYPASS:\n"
                "            _sc_bypasses += 1\n"
                f"            return _sc_f({_call_args(params, direct)})\n"
            )
        miss_call = f"_sc_X[0]({args_tuple}, _sc_k)"

    # Every call of a closure copies each of its cells into its frame: the generated
    # functions close over what their hit and bypass paths use, and no more.
    bypasses = layout.key == "callable" or bool(layout.only)
    shared = ["_sc_FID", "_sc_hits", "_sc_X"]
    if bypasses:
        shared += ["_sc_bypasses", "_sc_BYPASS", "_sc_f"]
    if layout.key == "callable":
        shared.append("_sc_key")
    shared += [f"_sc_O_{i}" for i in range(len(layout.only))]
    # Both code objects must close over the same cells, in the same (sorted) order, for
    # the __code__ swap: each names every shared cell in a branch that never runs.
    declare = (
        "        nonlocal _sc_hits, _sc_bypasses\n"
        if bypasses
        else "        nonlocal _sc_hits\n"
    )
    touch = f"        if False:\n            ({', '.join(shared)},)\n"
    defaults = [f"_sc_D_{p.name}" for p in params if p.default is not P.empty]
    factory_params = ", ".join(
        [
            "_sc_FID",
            "_sc_f",
            "_sc_key",
            "_sc_M",
            "_sc_slow",
            "_sc_VAL",
            "_sc_SNAP",
            "_sc_snapshot",
            "_sc_on_hit",
            "_sc_lean",
            "_sc_BYPASS",
            *defaults,
            *(f"_sc_O_{i}" for i in range(len(layout.only))),
        ]
    )
    return (
        f"def _sc_factory({factory_params}):\n"
        "    _sc_hits = 0\n"
        "    _sc_bypasses = 0\n"
        # the miss is a closure of its own: its cells are not copied into the hit path
        + _miss_source(layout, packed)
        # what only misses and odd values use, in one cell: every call of a closure
        # copies each of its cells into its frame, so the hit path closes over few
        + "    _sc_X = (\n"
        f"        _miss, _sc_slow, _sc_on_hit, _sc_VAL, _sc_SNAP, _sc_snapshot, _sc_lean,\n"
        f"        _sc_ABSENT,\n"
        f"    )\n"
        f"\n"
        f"    def _fast({sig}):\n"
        + declare
        + touch
        + prologue
        + matched(["_sc_hits += 1", "return _sc_e[0]"])
        + f"        return {miss_call}\n"
        f"\n"
        f"    def _checks({sig}):\n"
        + declare
        + touch
        + prologue
        + "        _sc_ok = False\n"
        # the debug checks run outside the try: their errors must reach the caller
        + matched(["_sc_ok = True"])
        + "        if _sc_ok:\n"
        + _lean_checks(layout, direct, args_tuple)
        + f"            return _sc_X[2](_sc_e, {args_tuple})\n"
        f"        return _sc_X[1]({args_tuple})\n"
        f"\n"
        f"    def _switched({sig}):\n"
        + declare
        + touch
        + f"        return _sc_X[1]({args_tuple})\n"
        f"\n"
        f"    def _invoke(a):\n"
        f"        return _sc_f({_call_args(params, packed)})\n"
        f"\n"
        f"    def _keyof(a):\n"
        f"        return {keyof if keyof is not None else 'None'}\n"
        f"\n"
        f"    def _depvals(a):\n"
        f"        return {dep_values}\n"
        f"\n"
        f"    def _counts_get():\n"
        f"        return _sc_hits, _sc_bypasses\n"
        f"\n"
        f"    def _hits_add(n):\n"
        f"        nonlocal _sc_hits, _sc_bypasses\n"
        f"        if n:\n"
        f"            _sc_hits += n\n"
        f"        else:\n"
        f"            _sc_hits = _sc_bypasses = 0\n"
        f"\n"
        f"    return (\n"
        f"        _fast, _switched, _checks, _invoke, _keyof, _depvals, _counts_get,\n"
        f"        _hits_add, _miss,\n"
        f"    )\n"
    )


#: what the generated miss uses, in the order of the factory's ``_sc_M`` tuple
MISS_HELPERS: tuple[str, ...] = (
    "_sc_cf",  # the CachedFunction: its rare paths (settle, reject, bypass, errors)
    "_sc_NO_KEY",
    "_sc_store_for",
    "_sc_StepCache",
    "_sc_Tensor",
    "_sc_VC",  # fingerprint's value classes
    "_sc_fp",  # fingerprint()
    "_sc_rguard",  # result_guard()
    "_sc_wref",  # weakref.ref
    "_sc_QC",  # the constants of the inline expect check
    "_sc_device",  # torch.device
    # not the miss's: the entry a hit finds where its store has none
    "_sc_ABSENT",
    "_sc_new_store",  # new_store(): a new owner's first store
    "_sc_NO_STORE",  # the placeholder store
    "_sc_side",  # the side table of slotted owners' stores (empty: none there)
    "_sc_EMPTY_SLOT",  # the placeholder's slot: a keyed lookup where a store has none
)


def _miss_source(layout: Layout, packed: dict[str, str]) -> str:
    """Source of ``_miss(a, key)``: a production call the fast code could not answer.

    Everything a miss usually does is written out here for this one function: find
    the owner's store, fingerprint each dependency, call the function, run the
    compiled ``expect`` check, guard the result, insert the entry, count. The rare
    cases go to the CachedFunction (``_sc_cf``): an entry that is already there
    (``settle``), a value ``expect`` may reject (``reject``), a bypass, a store that
    is not the owner's own open one, or none yet (``store_for``), a missing
    dependency (its typed error). A miss runs once per owner and step, between the
    builders' tensor work, where every Python call and object touched costs
    microseconds.
    """
    params = layout.params
    owner_i = _index(params, layout.owner)
    keyed = layout.key is not None
    out = ["    def _miss(a, _sc_k=_sc_NO_KEY):"]
    add = out.append
    if keyed or layout.only:
        add("        if _sc_k is _sc_NO_KEY:")
        add("            _sc_k = _sc_cf.key_of(a)")
        add("        if _sc_k is _sc_BYPASS:")
        add("            return _sc_cf.bypass(a)")
    else:
        add("        _sc_k = None")
    add(f"        _sc_o = a[{owner_i}]")
    add("        try:")
    add(f"            _sc_s = _sc_o.{ATTR}")
    add("        except Exception:")
    add("            _sc_s = None")
    n = len(layout.deps)
    # An entry without dependencies is bound to its owner by a weak reference: the
    # store's own (the same object weakref.ref(owner) returns) unless the store is
    # shared with other owners or kept in the side table (store_for's cases).
    # A new owner whose class has the placeholder: its first store, made short.
    add("        if _sc_s is _sc_NO_STORE and not _sc_side:")
    add("            _sc_s = _sc_new_store(_sc_o)")
    if not n:
        add("            _sc_r = _sc_s._owner_ref")
    add(
        "        elif _sc_s.__class__ is not _sc_StepCache or _sc_s._closed"
        " or _sc_s._owner_ref is None or _sc_s._owner_ref() is not _sc_o:"
    )
    # what was read is passed on, not read again
    add("            _sc_s = _sc_store_for(_sc_o, _sc_s)")
    if not n:
        add("            _sc_r = _sc_wref(_sc_o)")
        add("        else:")
        add("            _sc_r = _sc_s._owner_ref")
    if keyed:
        # the lookup hashes the key (the hit's may not have: no slot yet), so an
        # unhashable key gets its typed error here, before the function runs
        add("        try:")
        add("            _sc_old = _sc_s._e.get(_sc_FID, _sc_EMPTY_SLOT).get(_sc_k)")
        add("        except TypeError:")
        add("            _sc_cf.checked(_sc_k)")
        add("            raise")
    else:
        add("        _sc_old = _sc_s._e.get(_sc_FID)")
    add("        if _sc_old is not None and _sc_cf.settle(_sc_old, a, _sc_k, _sc_s):")
    add("            return _sc_old[0]")
    xs = [f"_sc_x{i}" for i in range(n)]
    if n:
        add("        try:")
        for x, dep in zip(xs, layout.deps, strict=True):
            add(f"            {x} = {_dep_expr(dep, f'a[{owner_i}]', packed)}")
        add("        except AttributeError:")
        add(f"            {', '.join(xs)}, = _sc_cf.dep_values(a, _sc_k)")
        for i, x in enumerate(xs):
            # fingerprint()'s two common cases inline
            add(
                f"        {x}, _sc_v{i} = ({x}, {x}._version) if {x}.__class__ is"
                f" _sc_Tensor else ({x}, _sc_VAL) if {x}.__class__ in _sc_VC"
                f" else _sc_fp({x})"
            )
    add(f"        _sc_val = _sc_f({_call_args(params, packed)})")
    if layout.check:
        add("        _sc_ok = False")
        add("        try:")
        add("            while True:")
        for line in layout.check:
            add("                " + line)
        add("        except Exception:")
        add("            _sc_ok = False")
        add("        if not _sc_ok:")
        add("            _sc_cf.reject(_sc_val, a, _sc_k)")
    parts = ["_sc_val", "None" if n else "_sc_r"]
    for i, x in enumerate(xs):
        parts += [x, f"_sc_v{i}"]
    if layout.guard:
        add("        if _sc_val.__class__ is _sc_Tensor:")
        add("            _sc_g, _sc_gv = _sc_val, _sc_val._version")
        add("        else:")
        add("            _sc_g, _sc_gv = _sc_rguard(_sc_val)")
        parts += ["_sc_g", "_sc_gv"]
    add(f"        _sc_new = ({', '.join(parts)})")
    # no lock: each write is one dict operation; a store closed meanwhile is emptied
    if keyed:
        add("        _sc_slot = _sc_s._e.get(_sc_FID)")
        add("        if _sc_slot is None:")
        add("            _sc_slot = _sc_s._e.setdefault(_sc_FID, {})")
        add("        _sc_slot[_sc_k] = _sc_new")
    else:
        add("        _sc_s._e[_sc_FID] = _sc_new")
    add("        if _sc_s._closed:")
    add("            _sc_s.clear()")
    add("        _sc_cf.misses += 1")
    add("        _sc_c = _sc_s._counts.get(_sc_FID)")
    add("        if _sc_c is None:")
    add("            _sc_s._counts[_sc_FID] = [1, 0, 0]")
    add("        else:")
    add("            _sc_c[0] += 1")
    add("        return _sc_val")
    return (
        f"    ({', '.join(MISS_HELPERS)},) = _sc_M\n"
        + "".join(line + "\n" for line in out)
        + "\n"
    )


def _lean_checks(layout: Layout, ref: dict[str, str], args_tuple: str) -> str:
    """A checks-mode hit's usual work, inline: see ``stepcache._debug._lean_plan``.

    ``_sc_X[6]`` is ``(the _switches module, the compiled expect check, the _Info
    class)``; the check is called only for a function with ``expect``. The entry's info holds the plan: rows of tensor dependencies to
    compare (index, data pointer, dtype, shape, numpy view, bytes) and the result's
    (tensor, version) pairs, or None when the hit needs ``_sc_X[2]``
    (``stepcache._debug.on_hit``), which also runs whenever a comparison here fails,
    to say what changed.
    """
    deps = "(" + "".join(_dep_expr(d, layout.owner, ref) + ", " for d in layout.deps)
    compare = (
        [
            "                    if _sc_l[0]:",
            f"                        _sc_d = {deps})",
            "                        for _sc_j, _sc_p, _sc_t, _sc_s, _sc_w, _sc_r in _sc_l[0]:",
            "                            _sc_x = _sc_d[_sc_j]",
            "                            if (_sc_x.data_ptr() != _sc_p or _sc_x.dtype is not"
            " _sc_t or _sc_x.shape != _sc_s or (_sc_w is not None and _sc_w.tobytes()"
            " != _sc_r)):",
            "                                _sc_ok = False",
            "                                break",
        ]
        if layout.deps
        else []
    )
    lines = [
        "            try:",
        "                _sc_T = _sc_X[6]",
        "                _sc_i = _sc_e[-1]",
        "                if _sc_i.__class__ is _sc_T[2] and _sc_i.lean is not None"
        ' and _sc_T[0]._debug == "checks":',
        "                    _sc_l = _sc_i.lean",
        *compare,
        "                    for _sc_x, _sc_v in _sc_l[1]:",
        "                        if _sc_x._version != _sc_v:",
        "                            _sc_ok = False",
        "                            break",
        (
            f"                    if _sc_ok and _sc_T[1](_sc_e[0], {args_tuple}):"
            if layout.check
            else "                    if _sc_ok:"
        ),
        "                        _sc_hits += 1",
        "                        return _sc_i.handed",
        "            except Exception:",
        "                pass",
    ]
    return "".join(line + "\n" for line in lines)


def _index(params: Sequence[inspect.Parameter], name: str) -> int:
    for i, p in enumerate(params):
        if p.name == name:
            return i
    raise KeyError(name)
