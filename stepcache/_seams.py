# SPDX-License-Identifier: Apache-2.0
"""The seams between the decorator, the generated hit and debug mode, as Protocols:
what each reads of the others, so that a checker sees a wrong argument across them
(the modules would import each other in a circle)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Container, Hashable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from stepcache._entry import Entry
    from stepcache._errors import CacheValidationError, StaleCacheError
    from stepcache._spec import Spec
    from stepcache._state import Counts
    from stepcache._store import StepCache

Args = tuple[Any, ...]


class Cached(Protocol):
    """A decorated function as the hit and debug mode see it
    (``stepcache._decorator.CachedFunction``)."""

    fid: int
    name: str
    label: str
    fn: Callable[..., Any]
    params: tuple[inspect.Parameter, ...]
    names: list[str]
    index: dict[str, int]
    owner_name: str
    owner_index: int
    keyed: bool
    key_fn: Callable[..., Hashable] | None
    key_names: tuple[str, ...]
    dep_names: tuple[str, ...]
    ignored: tuple[str, ...]
    only: dict[str, Container[Any]]
    guard: bool
    expect: Spec | None
    arg_refs: tuple[str, ...]
    of_args: Spec | None
    counts: Counts
    absent: Entry
    refs_of: Callable[[Any], tuple[Any, ...]]
    run: Callable[[Args], Any]

    def call(self, a: Args, key: Any = ...) -> Any: ...
    def served(self, a: Args, key: Any, entry: Entry) -> Any: ...
    def args_ok(self, value: Any, a: Args) -> bool: ...
    def fingerprint(self, i: int, x: Any, store: object) -> tuple[Any, Any]: ...
    def violation(self, value: Any, a: Args) -> str | None: ...
    def invalid(self, key: Any, wrong: str) -> CacheValidationError: ...
    def where(self, key: Any = ...) -> str: ...
    def key_of(self, a: Args) -> Any: ...


class Recorded(Protocol):
    """What debug mode records of a miss while the function runs."""

    def stop(self) -> None: ...


class Watch(Protocol):
    """Debug mode's hooks on the slow path (``stepcache._debug.Checks``)."""

    def bypassed(self, fn: Cached, a: Args) -> None: ...
    def closed(
        self, fn: Cached, key: Any, error: StaleCacheError
    ) -> StaleCacheError | CacheValidationError: ...
    def invalid(
        self, fn: Cached, key: Any, wrong: str
    ) -> StaleCacheError | CacheValidationError: ...
    def hit(
        self,
        fn: Cached,
        a: Args,
        key: Any,
        owner: object,
        store: StepCache,
        deps: Args,
        entry: Entry,
    ) -> Any: ...
    def before_miss(
        self, fn: Cached, a: Args, key: Any, store: StepCache, deps: Args
    ) -> Recorded: ...
    def after_miss(
        self, fn: Cached, miss: Any, a: Args, key: Any, value: Any
    ) -> Any: ...
    def hand_out(self, fn: Cached, key: Any, entry: Entry, store: StepCache) -> Any: ...


__all__ = ["Args", "Cached", "Mapping", "Recorded", "Watch"]
