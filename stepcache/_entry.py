# SPDX-License-Identifier: Apache-2.0
"""A cached value and what it was computed from (`Entry`), and the rule that says
whether it still holds: :func:`condition`, written once as source text.

Each decorated function's hit inlines :func:`condition` (`stepcache._hit`); every
other path calls `Entry.matches`, compiled from the same text.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any, Final

from stepcache._fingerprint import MATCH, MATCH_GLOBALS

#: an entry without dependencies serves only the owner that computed it: it holds
#: the owner's plain weak reference, of which CPython keeps one per object
_BOUND: Final = "{e}.bound is {ref}"
#: a guarded result (``guard_result=True``) is still as it was stored
_GUARD: Final = "{e}.guard._version == {e}.gtag"


def condition(
    e: str, ref: str, deps: Sequence[str], guard: bool, prefix: str = "_sc_x"
) -> tuple[list[str], str]:
    """Source of the test that entry ``e`` serves a call: assignments of the
    dependency expressions ``deps`` to locals, and the condition over them; ``ref``
    is the owner's plain weak reference (what ``weakref.ref(owner)`` returns).

    >>> lines, test = condition("e", "_sc_ref(md)", ["md.qsl"], guard=False)
    >>> lines
    ['_sc_x0 = md.qsl', '_sc_xd = e.deps']
    >>> test.startswith("((_sc_x0 is _sc_xd[0] and")
    True
    """
    lines = [f"{prefix}{i} = {expr}" for i, expr in enumerate(deps)]
    if deps:
        lines.append(f"{prefix}d = {e}.deps")
    parts = [] if deps else [_BOUND.format(e=e, ref=ref)]
    for i in range(len(deps)):
        o, v = f"{prefix}d[{2 * i}]", f"{prefix}d[{2 * i + 1}]"
        parts.append("(" + MATCH.format(x=f"{prefix}{i}", o=o, v=v) + ")")
    if guard:
        parts.append(_GUARD.format(e=e))
    return lines, " and ".join(parts)


#: the names :func:`condition`'s source reads
CONDITION_GLOBALS: Final = {**MATCH_GLOBALS, "_sc_ref": weakref.ref}


class Entry:
    """One cached value: ``value``; ``bound``, a weak reference to the owner that
    computed it (entries without dependencies serve only that owner) or ``None``;
    ``deps``, the fingerprints of its dependencies, flat (``o0, v0, o1, v1, ...``);
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
        self.value = value
        self.bound = bound
        self.deps = deps
        self.guard = guard
        self.gtag = gtag
        self.info = info

    def matches(self, owner: object, xs: Sequence[Any]) -> bool:
        """Whether this entry serves a call on ``owner`` whose dependencies are ``xs``
        (the test a hit inlines, :func:`condition`)."""
        return bool(_matches(len(xs), self.guard is not None)(self, owner, *xs))


@functools.cache
def _matches(n: int, guard: bool) -> Any:
    """:func:`condition` compiled for ``n`` dependencies."""
    xs = [f"x{i}" for i in range(n)]
    lines, test = condition("e", "_sc_ref(owner)", xs, guard, "x")
    body = "".join(f" {line}\n" for line in lines[n:])  # the xs are the arguments
    namespace = dict(CONDITION_GLOBALS)
    args = "".join(x + ", " for x in xs)
    exec(f"def m(e, owner, {args}):\n{body} return {test}\n", namespace)
    return namespace["m"]


_NOTHING = object()
#: The entry a hit finds where there is none (see `stepcache._store.NO_STORE`): it
#: fails every :func:`condition` without raising.
ABSENT: Final = Entry(None, type(None), (_NOTHING, _NOTHING), _NOTHING, _NOTHING)  # type: ignore[arg-type]
