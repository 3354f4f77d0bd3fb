# SPDX-License-Identifier: Apache-2.0
"""Process-wide counters per decorated function, and their table."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

from stepcache._registry import all_functions, by_name
from stepcache._store import live_caches, measure


@dataclasses.dataclass(frozen=True)
class FunctionStats:
    """Counters of one decorated function across the process.

    Attributes:
        name: The function's label (`name=` of the decorator, or its qualified name):
            the counters of functions that share one are added up in its row.
        hits: Calls answered from the cache.
        misses: Calls that computed and stored a value (invalidations included).
        bypasses: Calls computed uncached ([`BYPASS`][stepcache.BYPASS], caching off).
        invalidations: Misses caused by a changed dependency of an existing entry.
        live_entries: Entries held by the live caches now.
        live_bytes: Bytes of tensor and array data those entries hold.

    Examples:
        >>> import stepcache
        >>> row = stepcache.FunctionStats("Meta.index", 3, 1, 0, 0, 1, 4096)
        >>> row.calls, row.hit_rate
        (4, 0.75)
    """

    name: str
    hits: int
    misses: int
    bypasses: int
    invalidations: int
    live_entries: int
    live_bytes: int

    @property
    def calls(self) -> int:
        """Every call that went through the decorator."""
        return self.hits + self.misses + self.bypasses

    @property
    def hit_rate(self) -> float:
        """Hits per call (0.0 when never called)."""
        return self.hits / self.calls if self.calls else 0.0


_COLUMNS = ("function", "hits", "misses", "bypasses", "invalidations", "live", "bytes")


@dataclasses.dataclass(frozen=True)
class StatsTable(Mapping[str, FunctionStats]):
    """Stats per decorated function, by name; `str()` renders a readable table.

    A read-only mapping of labels to [`FunctionStats`][stepcache.FunctionStats].

    Examples:
        >>> import stepcache
        >>> row = stepcache.FunctionStats("Meta.index", 7, 1, 0, 0, 1, 4096)
        >>> table = stepcache.StatsTable((row,))
        >>> print(table)
        function    hits  misses  bypasses  invalidations  live    bytes
        ----------  ----  ------  --------  -------------  ----  -------
        Meta.index     7       1         0              0     1  4.0 KiB
        >>> table.to_dict()["Meta.index"]["live_bytes"]
        4096
    """

    rows: tuple[FunctionStats, ...]

    def __getitem__(self, name: str) -> FunctionStats:
        return {r.name: r for r in reversed(self.rows)}[name]  # the first of a name

    def __iter__(self) -> Iterator[str]:
        return (row.name for row in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """Plain data, for JSON."""
        # each row's counts, by its name (popped: the key is read first)
        return {d.pop("name"): d for d in map(dataclasses.asdict, self.rows)}

    def __str__(self) -> str:
        if not self.rows:
            return "stepcache: no decorated function has been called"
        rows = map(dataclasses.astuple, self.rows)
        lines = [_COLUMNS, *((n, *map(str, c), _human(s)) for n, *c, s in rows)]
        widths = [max(map(len, column)) for column in zip(*lines, strict=True)]
        lines.insert(1, tuple("-" * w for w in widths))
        # the names left-aligned, the numbers right-aligned
        fmt = "  ".join([f"%-{widths[0]}s", *(f"%{w}s" for w in widths[1:])])
        return "\n".join(fmt % line for line in lines)


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    return f"{n / 1024:.1f} KiB" if n < 1024**2 else f"{n / 1024**2:.1f} MiB"


def stats(*, include_idle: bool = False) -> StatsTable:
    """Return the counters per decorated function across the process.

    A row per function called since the last [`reset_stats()`][stepcache.reset_stats]
    or holding live entries; `include_idle=True` adds the others.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.answer")
        ...     def answer(self):
        ...         return 42
        >>> m = Meta()
        >>> m.answer(), m.answer()
        (42, 42)
        >>> stepcache.stats()["ex.answer"]
        FunctionStats(name='ex.answer', hits=1, misses=1, bypasses=0, invalidations=0, live_entries=1, live_bytes=0)
    """
    live, rows = measure(live_caches()), []
    for fn in all_functions():
        c, held = fn.counts, live.get(fn.fid, (0, 0))
        rows.append((fn.fid, [c.hits, c.misses, c.bypasses, c.invalidations, *held]))
    merged = (FunctionStats(n, *c) for n, c in by_name(rows).items())
    kept = tuple(r for r in merged if include_idle or r.calls or r.live_entries)
    return StatsTable(kept)


#: called just before `reset_stats()` zeroes the counters (the pytest plugin adds
#: them to its session's totals first)
before_reset: list[Callable[[], None]] = []


def reset_stats() -> None:
    """Zero every function's counters (live entries are not touched).

    Examples:
        >>> import stepcache
        >>> stepcache.reset_stats()
        >>> all(row.calls == 0 for row in stepcache.stats().values())
        True
    """
    for hook in list(before_reset):
        hook()
    for fn in all_functions():
        fn.counts.reset()
