# SPDX-License-Identifier: Apache-2.0
"""Guarded tensors: what debug mode hands out, so that a stale read raises where it
happens."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import SupportsIndex

import torch

from stepcache._entry import walk
from stepcache._kinds import plain_torch, strided

#: how `__torch_function__` is called: an op, its positional and keyword arguments
Op = Callable[..., object]
OpArgs = tuple[object, ...]
OpKwargs = Mapping[str, object] | None
#: a guarded view's check (`GuardedTensor._sc_guard`)
Guard = Callable[[torch.Tensor], None]


class GuardedTensor(torch.Tensor):
    """A tensor handed out by a cache in debug mode, guarded against stale reads.

    Every torch operation on it first checks that its cache is open and its storage
    unwritten since, else raises [`StaleCacheError`][stepcache.StaleCacheError]; its
    results and a `clone()` taken in time are plain tensors.

    Examples:
        >>> import stepcache, torch
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.guarded")
        ...     def lens(self):
        ...         return torch.tensor([2, 1])
        >>> with stepcache.debug("checks"):
        ...     m = Meta()
        ...     lens = m.lens()
        ...     kept = lens.clone()
        >>> stepcache.cache_of(m).close()
        >>> type(lens).__name__, kept
        ('GuardedTensor', tensor([2, 1]))
        >>> lens + 1
        Traceback (most recent call last):
          ...
        stepcache.StaleCacheError: step_cached function 'ex.guarded': this value was handed out by a step cache that has since been closed (the step is over), and it was used again. Fix: finish using step values within the step, or keep a copy with .clone().
        >>> stepcache.clear_debug_report()
    """

    #: raises unless this view may still be used (set by `guarded`)
    _sc_guard: Guard

    @classmethod
    def __torch_function__(
        cls, func: Op, types: Iterable[type], args: OpArgs = (), kwargs: OpKwargs = None
    ) -> object:
        kwargs = kwargs or {}
        with plain_torch():
            for arg in (*args, *kwargs.values()):
                for t in arg if isinstance(arg, (tuple, list)) else (arg,):
                    if isinstance(t, GuardedTensor):
                        t.stepcache_check()
            return func(*args, **kwargs)

    def stepcache_check(self) -> None:
        """Raise unless this view's cache is open and its storage unwritten since."""
        if (guard := self.__dict__.get("_sc_guard")) is not None:
            guard(self)

    # a copy, a deep copy or a pickle is of the plain tensor, once the guard passed: a
    # copy made in time is not the cache's (nor can its guard be pickled)
    def _sc_plain(self) -> torch.Tensor:
        with plain_torch():
            self.stepcache_check()
            return self.as_subclass(torch.Tensor)

    def __deepcopy__(self, memo: dict[int, object]) -> torch.Tensor:
        return copy.deepcopy(self._sc_plain(), memo)

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[object, ...]:
        # as object: torch leaves its own __reduce_ex__ unannotated
        plain: object = self._sc_plain()
        return plain.__reduce_ex__(protocol)


def guarded(value: object, guard_of: Callable[[torch.Tensor], Guard]) -> object:
    """``value`` with each tensor in it (as `walk` finds them) handed out as a
    `GuardedTensor` view whose guard is ``guard_of(tensor)``; tensors with no plain
    memory (sparse, nested) and guarded views are handed out as they are."""

    def view(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, GuardedTensor) or not strided(t):
            return t
        guarded = t.as_subclass(GuardedTensor)
        guarded.__dict__["_sc_guard"] = guard_of(t)
        return guarded

    return walk(value, view)
