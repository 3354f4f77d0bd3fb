# SPDX-License-Identifier: Apache-2.0
"""Every decorated function of the process, by id, and the switch that picks its code."""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepcache._decorator import CachedFunction

__all__ = ["all_functions", "name_of", "new_id", "register"]

_ids = itertools.count(1)
_by_id: weakref.WeakValueDictionary[int, CachedFunction] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def new_id() -> int:
    return next(_ids)


def register(fn: CachedFunction) -> None:
    with _lock:
        _by_id[fn.fid] = fn


def all_functions() -> list[CachedFunction]:
    with _lock:
        return sorted(_by_id.values(), key=lambda f: f.fid)


def name_of(fid: int) -> str:
    fn = _by_id.get(fid)
    return fn.name if fn is not None else f"<function #{fid}>"
