# SPDX-License-Identifier: Apache-2.0
"""From recorded calls to a cache design: the owner, the key, ``depends_on``.

For each function the analysis tries, within every step, to group its calls by an
*owner* parameter (an object or tensor that is new in every step: the step's metadata)
and a subset of the other parameters (the *key*). A grouping works when every call of a
group returned an equal result; its *hits* are the calls after the first of each group
(what a cache with that owner and key would have served). The grouping with the most
hits wins; ties go to no ``BYPASS``, an object owner over a tensor, fewer key
parameters, earlier parameters.

A key parameter whose groups disagree for a few of its values (DeepSeek V4's C4A layers
pick different indices per layer) may be kept with those values sent to
``stepcache.BYPASS``. Parameters that vary but never change the result (the builder's
own output buffer, the layer number of an SWA layer) are left out of the key and named
in the notes. Results compare by contents (see ``_argprint.digest``); a result that
cannot be digested, and ``None`` (which says nothing of what a call did through its
arguments), only counts as equal for calls whose arguments were identical.

Suggestions come from what was observed; confirm them with stepcache's ``verify``
debug mode, which recomputes every hit and compares.
"""

from __future__ import annotations

import enum
import itertools
import statistics
from collections.abc import Hashable, Sequence
from inspect import Parameter
from typing import Any, Final

import attrs

from stepcache.profiler import _argprint
from stepcache.profiler._recorder import Call, FnState

__all__ = ["Suggestion", "suggest"]

_MAX_KEY: Final = 3
_MAX_PARAMS: Final = 10
_MAX_BYPASS_VALUES: Final = 3


@attrs.frozen
class Suggestion:
    """A cache design for one function, inferred from its calls."""

    #: the parameter whose object owns the cache (``None``: no parameter lives one step)
    owner: str | None
    #: the parameters that distinguish entries
    key: tuple[str, ...]
    #: ``(parameter, values)``: calls with these values are computed, not cached
    bypass: tuple[str, tuple[Any, ...]] | None
    depends_on: tuple[str, ...]
    #: parameters that varied without changing the result, left out of the key
    ignored: tuple[str, ...]
    #: a ready decorator line (``None`` when there is no owner)
    decorator: str | None
    notes: tuple[str, ...]
    #: calls the suggested cache would have served, and their time (``hits`` times
    #: the function's median call time)
    hits: int
    hit_ns: int


@attrs.frozen
class _Option:
    hits: int
    owner: int | None
    key: tuple[int, ...]
    bypass: tuple[int, frozenset[Hashable]] | None
    served: tuple[Call, ...]


def median_ns(calls: list[Call]) -> int:
    """The time of one call: the median of ``calls``' times, but for the first ones
    (``Call.watched``: they record reads, and the first pays one-time costs) when
    there are others. The lower median of an even count, so that with two calls
    the one stalled is not half of the figure (a 31 ms first call made a 20 us
    function's median of two 15.8 ms, and its redundant time 800 times the usual)."""
    timed = [c.ns for c in calls if not c.watched] or [c.ns for c in calls]
    return int(statistics.median_low(timed)) if timed else 0


def suggest(fn: FnState, steps_seen: int) -> Suggestion | None:
    """The best cache design for ``fn``, or ``None`` when no call would be served.

    Marks each call the design would serve (``call.redundant``).
    """
    calls = fn.kept
    fn.median_ns = median_ns(calls)
    if not calls or not fn.params or fn.lazy or fn.cached:
        return None
    n = len(fn.params)
    by_step: dict[int, list[Call]] = {}
    for call in calls:
        if len(call.codes) < n:
            # No signature: names first seen after this call were absent (None) in it.
            for name in fn.params[len(call.codes) :]:
                fn.kinds.setdefault(name, set()).add(_argprint.KIND_VALUE)
            call.codes += (None,) * (n - len(call.codes))
        by_step.setdefault(call.step, []).append(call)
    varying = [
        i
        for i in range(n)
        if any(len({c.codes[i] for c in group}) > 1 for group in by_step.values())
    ][:_MAX_PARAMS]
    owners = [i for i in range(n) if _owner_kind(fn, i) is not None]
    best: _Option | None = None
    for owner in [*owners, None]:
        if owner is None and best is not None and best.hits > 0:
            break  # an owner that serves calls beats merging calls across owners
        rest = [i for i in varying if i != owner]
        subsets: list[tuple[int, ...]] = [
            s
            for k in range(min(_MAX_KEY, len(rest)) + 1)
            for s in itertools.combinations(rest, k)
        ]
        if len(rest) > _MAX_KEY:
            subsets.append(tuple(rest))
        for subset in subsets:
            for option in _options(by_step, owner, subset, fn):
                if best is None or _rank(option, fn) < _rank(best, fn):
                    best = option
    if best is None or best.hits == 0:
        return None
    for call in best.served:
        call.redundant = True
    return _describe(fn, best, varying, steps_seen)


def _owner_kind(fn: FnState, i: int) -> str | None:
    name = fn.params[i]
    kinds = fn.kinds.get(name, set())
    if not kinds or name in fn.persistent:
        return None
    if kinds == {_argprint.KIND_OBJECT}:
        return "self" if name in ("self", "cls") and i == 0 else "object"
    if kinds == {_argprint.KIND_TENSOR}:
        return "tensor"
    return None


_OWNER_RANK: Final = {"object": 0, "self": 1, "tensor": 2}


def _rank(option: _Option, fn: FnState) -> tuple[Any, ...]:
    owner_rank = (
        3
        if option.owner is None
        else _OWNER_RANK[_owner_kind(fn, option.owner) or "tensor"]
    )
    return (
        -option.hits,
        option.bypass is not None,
        owner_rank,
        len(option.key),
        option.key,
        option.owner if option.owner is not None else -1,
    )


def _options(
    by_step: dict[int, list[Call]],
    owner: int | None,
    key: tuple[int, ...],
    fn: FnState,
) -> list[_Option]:
    cols = ((owner,) if owner is not None else ()) + key
    good: list[list[Call]] = []
    bad: list[list[Call]] = []
    for calls in by_step.values():
        groups: dict[tuple[Hashable, ...], list[Call]] = {}
        for call in calls:
            groups.setdefault(tuple(call.codes[i] for i in cols), []).append(call)
        for group in groups.values():
            (good if _agree(group) else bad).append(group)
    if not bad:
        served = [c for g in good for c in g[1:]]
        return [_option(owner, key, None, served)]
    options = []
    for q in key:
        if fn.kinds.get(fn.params[q]) != {_argprint.KIND_VALUE}:
            continue
        values = frozenset(g[0].codes[q] for g in bad)
        if len(values) > _MAX_BYPASS_VALUES:
            continue
        served = [c for g in good if g[0].codes[q] not in values for c in g[1:]]
        if served:
            options.append(_option(owner, key, (q, values), served))
    return options


def _option(
    owner: int | None,
    key: tuple[int, ...],
    bypass: tuple[int, frozenset[Hashable]] | None,
    served: list[Call],
) -> _Option:
    return _Option(len(served), owner, key, bypass, tuple(served))


def _agree(group: list[Call]) -> bool:
    if len(group) == 1:
        return True
    first = group[0]
    if all(c.result is not None and c.result == first.result for c in group):
        return True
    # Results that could not be digested: identical arguments still count as a repeat.
    return all(
        c.codes == first.codes and c.result is None and first.result is None
        for c in group
    )


# -- the words ------------------------------------------------------------------------------
def _describe(
    fn: FnState, best: _Option, varying: Sequence[int], steps_seen: int
) -> Suggestion:
    params = fn.params
    owner = params[best.owner] if best.owner is not None else None
    key = tuple(params[i] for i in best.key)
    bypass = (
        (
            params[best.bypass[0]],
            tuple(sorted((_value(v) for v in best.bypass[1]), key=repr)),
        )
        if best.bypass is not None
        else None
    )
    owner_kind = _owner_kind(fn, best.owner) if best.owner is not None else None
    depends: list[str] = []
    if owner is not None and owner_kind in ("object", "self"):
        depends.extend(sorted(fn.reads.get(owner, ())))
    depends.extend(
        p
        for p in key
        if fn.kinds.get(p) == {_argprint.KIND_TENSOR} and p not in depends
    )
    ignored = tuple(params[i] for i in varying if i not in best.key and i != best.owner)
    notes: list[str] = []
    if ignored:
        names = ", ".join(f"'{p}'" for p in ignored)
        notes.append(
            f"{names} varied, but calls that differed only there returned equal "
            "results: left out of the key"
        )
    if bypass is not None:
        notes.append(
            f"calls with {bypass[0]} in {list(bypass[1])!r} returned different results "
            "each time: they are computed, not cached (stepcache.BYPASS)"
        )
    if fn.returned_none:
        notes.append(
            f"{fn.returned_none} call(s) returned None, which is not compared: only "
            "calls with identical arguments count, and a cache would skip what the "
            "function does besides returning"
        )
    if fn.impure:
        notes.append(
            f"{fn.impure} call(s) with identical arguments returned different results: "
            "the function reads something its arguments do not show"
        )
    if owner is None:
        notes.append(
            "no parameter lives exactly one step (a new object each step): pass the "
            "step's metadata object to it, or cache the call in its caller"
        )
    elif owner_kind == "tensor":
        notes.append(
            f"the owner '{owner}' is a tensor: the entry is bound to that object; "
            "prefer the metadata object that holds it, so depends_on can track it"
        )
    elif not depends:
        notes.append(
            "no attribute reads recorded on the owner: the entry is bound to the owner "
            "object (name what it is computed from in depends_on to share it with copies)"
        )
    if steps_seen < 2:
        notes.append(
            "one step observed: profile two or more steps to tell the step's objects "
            "from long-lived ones"
        )
    decorator = None
    if owner is not None:
        decorator = _decorator(fn, owner, key, bypass, tuple(depends))
    return Suggestion(
        owner=owner,
        key=key,
        bypass=bypass,
        depends_on=tuple(depends),
        ignored=ignored,
        decorator=decorator,
        notes=tuple(notes),
        hits=best.hits,
        hit_ns=best.hits * fn.median_ns,
    )


def _value(fp: Hashable) -> Any:
    """The Python value behind a value fingerprint."""
    if isinstance(fp, tuple) and len(fp) >= 1 and fp[0] in (tuple, list):
        items = [_value(x) for x in fp[1:]]
        return tuple(items) if fp[0] is tuple else items
    if isinstance(fp, tuple) and len(fp) == 2 and isinstance(fp[0], type):
        cls, raw = fp
        if issubclass(cls, enum.Enum):
            return cls(raw)
        if cls in (float, complex) and raw == _argprint.NAN:
            return cls("nan")
        return raw
    return fp


def _decorator(
    fn: FnState,
    owner: str,
    key: tuple[str, ...],
    bypass: tuple[str, tuple[Any, ...]] | None,
    depends_on: tuple[str, ...],
) -> str:
    parts: list[str] = []
    if bypass is not None:
        q, values = bypass
        cond = f"{q} == {values[0]!r}" if len(values) == 1 else f"{q} in {values!r}"
        value = key[0] if len(key) == 1 else "(" + ", ".join(key) + ")"
        parts.append(
            f"key=lambda {_lambda_params(fn)}: stepcache.BYPASS if {cond} else {value}"
        )
    elif len(key) == 1:
        parts.append(f'key="{key[0]}"')
    elif key:
        parts.append(f"key={key!r}")
    params = list(fn.signature.parameters.values()) if fn.signature else []
    plain = [
        p.name
        for p in params
        if p.kind not in (Parameter.VAR_POSITIONAL, Parameter.VAR_KEYWORD)
    ]
    if not plain or plain[0] != owner:
        parts.append(f'owner="{owner}"')
    if depends_on:
        parts.append(f"depends_on={depends_on!r}")
    # step_cached refuses a parameter that no option names: the others are ignored
    covered = {owner, *key, *depends_on}
    ignore = tuple(p.name for p in params if p.name not in covered)
    if ignore and bypass is None:
        parts.append(f"ignore={ignore!r}")
    return f"@stepcache.step_cached({', '.join(parts)})"


def _lambda_params(fn: FnState) -> str:
    if fn.signature is None:
        return ", ".join(fn.params)
    out: list[str] = []
    star = False
    for p in fn.signature.parameters.values():
        if p.kind is Parameter.VAR_POSITIONAL:
            out.append(f"*{p.name}")
            star = True
        elif p.kind is Parameter.VAR_KEYWORD:
            out.append(f"**{p.name}")
        elif p.kind is Parameter.KEYWORD_ONLY and not star:
            out.append("*")
            out.append(p.name)
            star = True
        else:
            out.append(p.name)
    return ", ".join(out)
