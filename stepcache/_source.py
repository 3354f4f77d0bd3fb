# SPDX-License-Identifier: Apache-2.0
"""Functions written as source text (the generated hit, the constructors whose
lines the hit's miss inlines, the vLLM plugin's scope around a build): compiled with
their text kept in `linecache`, so that tracebacks, pdb and `inspect.getsource` show
it."""

from __future__ import annotations

import inspect
import linecache
from collections.abc import Sequence
from typing import Any

_P = inspect.Parameter
_EMPTY = _P.empty
#: how a parameter of each kind is passed on (to the function, or its key function)
_PASS: dict[Any, str] = {
    _P.VAR_POSITIONAL: "*{}",
    _P.VAR_KEYWORD: "**{}",
    _P.KEYWORD_ONLY: "{0}={0}",
}


class _Default(str):
    """A default value, written in the signature as the name of the global holding
    it."""

    def __repr__(self) -> str:
        return str(self)


def signature(params: Sequence[inspect.Parameter]) -> str:
    """``params`` as the text of a ``def``'s parameters, without annotations; a
    default is the global ``_sc_D_{name}`` (`defaults` gives them)."""
    plain = [
        p.replace(
            annotation=_EMPTY,
            default=p.default if p.default is _EMPTY else _Default(f"_sc_D_{p.name}"),
        )
        for p in params
    ]
    return str(inspect.Signature(plain))[1:-1]


def defaults(params: Sequence[inspect.Parameter]) -> dict[str, Any]:
    """The globals `signature`'s defaults name."""
    return {f"_sc_D_{p.name}": p.default for p in params if p.default is not _EMPTY}


def passed(params: Sequence[inspect.Parameter]) -> str:
    """The arguments of a call that passes each of ``params`` on, by its name."""
    return ", ".join(_PASS.get(p.kind, "{}").format(p.name) for p in params)


def compiled(label: str, text: str, namespace: dict[str, Any], name: str) -> Any:
    """Run ``text`` in ``namespace`` and return what it named ``name``; ``label`` is
    its file name in tracebacks."""
    linecache.cache[label] = (len(text), None, text.splitlines(True), label)
    exec(compile(text, label, "exec"), namespace)
    return namespace[name]


def method(label: str, head: str, body: Sequence[str], names: dict[str, Any]) -> Any:
    """The function ``def {head}:`` with the lines of ``body``, which read ``names``."""
    name = head.split("(", 1)[0]
    text = f"def {head}:\n" + "".join(f"    {line}\n" for line in body)
    return compiled(label, text, dict(names), name)
