# SPDX-License-Identifier: Apache-2.0
"""`BYPASS`: the key that means "compute, don't cache"."""

from __future__ import annotations

from typing import Final


class _Bypass:
    """The key that means "compute, don't cache"."""

    def __repr__(self) -> str:
        return "stepcache.BYPASS"

    def __reduce__(self) -> str:
        return "BYPASS"  # pickles and copies as this module's BYPASS itself


BYPASS: Final = _Bypass()
"""Returned by a key function: compute the value and do not cache it.

Such a call runs the function every time and counts as a *bypass* in
[`stats()`][stepcache.stats]. Use it for values that must not be shared: DeepSeek V4's
C4A layers build their sparse indices per layer, the other layers share one per step.

Examples:
    >>> import stepcache
    >>> def kind_or_bypass(md, kind):
    ...     return stepcache.BYPASS if kind == "c4a" else kind
    >>> @stepcache.step_cached(key=kind_or_bypass, name="ex.sparse")
    ... def sparse_index(md, kind):
    ...     print("building", kind)
    >>> class SWAMetadata: pass
    >>> md = SWAMetadata()
    >>> for kind in ("c128a", "c128a", "c4a", "c4a"):
    ...     sparse_index(md, kind)
    building c128a
    building c4a
    building c4a
"""
