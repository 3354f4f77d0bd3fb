# SPDX-License-Identifier: Apache-2.0
"""The decorated functions alive, by id, and what each has counted."""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction

lock = threading.Lock()  # held to change the registry, or to set a switch
new_id = itertools.count(1).__next__  # a new function's id: 1, 2, ...
#: the decorated functions alive, by id: changed, and listed for a switch, under `lock`
by_id: weakref.WeakValueDictionary[int, CachedFunction] = weakref.WeakValueDictionary()


class Counts:
    """The events of one decorated function (`stats()`), or of one function in one
    store (`StepCache.stats()`). Counted without a lock, as ``functools.lru_cache``
    counts: two threads counting at once may lose one."""

    __slots__ = ("bypasses", "hits", "invalidations", "misses")

    def reset(self) -> None:
        self.hits = self.misses = self.bypasses = self.invalidations = 0

    __init__ = reset  # a new function's counts start at zero


def all_functions() -> list[CachedFunction]:
    with lock:
        return sorted(by_id.values(), key=lambda f: f.fid)


def by_name(rows: Iterable[tuple[int, Sequence[int]]]) -> dict[str, list[int]]:
    """Counts per function id, added up per name: functions that share a name (a
    factory's, say) share its row."""
    out: dict[str, list[int]] = {}
    for fid, counts in rows:
        # a function gone since is named by its id
        name = fn.name if (fn := by_id.get(fid)) is not None else f"<function #{fid}>"
        row = out.setdefault(name, [0] * len(counts))
        row[:] = map(sum, zip(row, counts, strict=True))
    return out
