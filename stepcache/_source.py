# SPDX-License-Identifier: Apache-2.0
"""Functions written as source text (the generated hit, and the constructors whose
lines the hit's miss inlines): compiled with their text kept in `linecache`, so that
tracebacks, pdb and `inspect.getsource` show it."""

from __future__ import annotations

import linecache
from collections.abc import Sequence
from typing import Any


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
