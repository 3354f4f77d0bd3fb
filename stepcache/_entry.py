# SPDX-License-Identifier: Apache-2.0
"""A cached value and what it was computed from (`Entry`), and the rule that says
whether it still serves a call: :func:`condition`, written once as source text that
each hit inlines (`stepcache._hit`) and `Entry.matches` compiles."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any, Final

from stepcache._fingerprint import MATCH, MATCH_GLOBALS


def condition(
    e: str, ref: str, deps: Sequence[str], guard: bool
) -> tuple[list[str], str]:
    """Source of the test that entry ``e`` serves a call: assignments of the
    dependency expressions ``deps`` to locals, and the condition over them. ``ref`` is
    the owner's plain weak reference (what ``weakref.ref(owner)`` returns).

    >>> lines, test = condition("e", "_sc_ref(md)", ["md.qsl"], guard=False)
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


#: the names :func:`condition`'s source reads
CONDITION_GLOBALS: Final = {**MATCH_GLOBALS, "_sc_ref": weakref.ref}


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
        """Whether this entry serves a call on ``owner`` whose dependencies are ``xs``."""
        return bool(_matches(len(xs), self.guard is not None)(self, owner, *xs))


@functools.cache
def _matches(n: int, guard: bool) -> Any:
    """:func:`condition` compiled for ``n`` dependencies, passed as arguments."""
    xs = "".join(f"_sc_x{i}, " for i in range(n))
    lines, test = condition("e", "_sc_ref(owner)", [""] * n, guard)
    body = "".join(f" {line}\n" for line in lines[n:])
    namespace = dict(CONDITION_GLOBALS)
    exec(f"def m(e, owner, {xs}):\n{body} return {test}\n", namespace)
    return namespace["m"]


_NOTHING = object()
#: The entry a hit finds where there is none (see `stepcache._store.NO_STORE`): it
#: fails every :func:`condition` without raising.
ABSENT: Final = Entry(None, type(None), (_NOTHING, _NOTHING), _NOTHING, _NOTHING)  # type: ignore[arg-type]
