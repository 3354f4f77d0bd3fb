# SPDX-License-Identifier: Apache-2.0
"""Process-wide counters per decorated function, and their table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from stepcache._fingerprint import nbytes
from stepcache._state import all_functions
from stepcache._store import live_caches


@dataclasses.dataclass(frozen=True)
class FunctionStats:
    """Counters of one decorated function across the process.

    One row of [`stats()`][stepcache.stats].

    Attributes:
        name: The function's label (`name=` of the decorator, or its qualified name).
        hits: Calls answered from the cache.
        misses: Calls that computed and stored a value (invalidations included).
        bypasses: Calls that computed without caching: a
            [`BYPASS`][stepcache.BYPASS] key, or caching switched off.
        invalidations: Misses caused by a changed dependency of an existing entry.
        live_entries: Entries held by the live caches now.
        live_bytes: Bytes of tensor and array data those entries hold.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     n = 2
        ...     @stepcache.step_cached(depends_on=("n",), name="ex.double")
        ...     def double(self):
        ...         return 2 * self.n
        >>> m = Meta()
        >>> [m.double() for _ in range(4)]
        [4, 4, 4, 4]
        >>> row = stepcache.stats()["ex.double"]
        >>> row
        FunctionStats(name='ex.double', hits=3, misses=1, bypasses=0, invalidations=0, live_entries=1, live_bytes=0)
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
_COUNTS = ("hits", "misses", "bypasses", "invalidations", "live_entries")


@dataclasses.dataclass(frozen=True)
class StatsTable(Mapping[str, FunctionStats]):
    """Stats per decorated function, by name; `str()` renders a readable table.

    A read-only mapping from the functions' labels to
    [`FunctionStats`][stepcache.FunctionStats], as [`stats()`][stepcache.stats] returns.

    Examples:
        >>> import stepcache
        >>> row = stepcache.FunctionStats("Meta.index", 7, 1, 0, 0, 1, 4096)
        >>> table = stepcache.StatsTable((row,))
        >>> table["Meta.index"].hits
        7
        >>> print(table)
        function    hits  misses  bypasses  invalidations  live    bytes
        ----------  ----  ------  --------  -------------  ----  -------
        Meta.index     7       1         0              0     1  4.0 KiB
        >>> table.to_dict()["Meta.index"]["live_bytes"]
        4096
    """

    rows: tuple[FunctionStats, ...]

    def __getitem__(self, name: str) -> FunctionStats:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (row.name for row in self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def to_dict(self) -> dict[str, dict[str, int]]:
        """Plain data, for JSON."""
        return {
            r.name: {k: v for k, v in dataclasses.asdict(r).items() if k != "name"}
            for r in self.rows
        }

    def __str__(self) -> str:
        if not self.rows:
            return "stepcache: no decorated function has been called"
        body = [
            (r.name, *(str(getattr(r, c)) for c in _COUNTS), _human(r.live_bytes))
            for r in self.rows
        ]
        widths = [max(map(len, column)) for column in zip(_COLUMNS, *body, strict=True)]

        def line(cells: tuple[str, ...]) -> str:
            pairs = zip(cells, widths, strict=True)
            return "  ".join(
                c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(pairs)
            )

        dashes = "  ".join("-" * w for w in widths)
        return "\n".join([line(_COLUMNS), dashes, *map(line, body)])


def _human(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    kib = n / 1024
    return f"{kib:.1f} KiB" if kib < 1024 else f"{kib / 1024:.1f} MiB"


def stats(*, include_idle: bool = False) -> StatsTable:
    """Return the counters per decorated function across the process.

    A row per function that was called since the last
    [`reset_stats()`][stepcache.reset_stats] or that holds live entries;
    `include_idle=True` adds the others. Hits are counted without a lock (the hit path
    takes none), so with several threads the hit count is a close estimate.

    The live entries are counted in the stores alive now. Stores are registered for
    this from the first call on: that call finds the stores alive by one pass over the
    garbage collector's objects (a store frozen by `gc.freeze()` before it is not
    seen), and from then on every new store registers itself.

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.answer")
        ...     def answer(self):
        ...         return 42
        >>> m = Meta()
        >>> m.answer(), m.answer()
        (42, 42)
        >>> table = stepcache.stats()
        >>> table["ex.answer"].hits, table["ex.answer"].misses
        (1, 1)
        >>> "ex.answer" in str(table)  # str(table) is the table to print
        True
    """
    live: dict[int, list[int]] = {}
    for store in live_caches():
        for fid, entry in store.entries():
            acc = live.setdefault(fid, [0, 0])
            acc[0] += 1
            acc[1] += nbytes(entry.value)
    rows = []
    for fn in all_functions():
        entries, size = live.get(fn.fid, (0, 0))
        row = FunctionStats(
            fn.name, fn.hits, fn.misses, fn.bypasses, fn.invalidations, entries, size
        )
        if include_idle or row.calls or entries:
            rows.append(row)
    return StatsTable(tuple(rows))


def reset_stats() -> None:
    """Zero every function's counters (live entries are not touched).

    Examples:
        >>> import stepcache
        >>> class Meta:
        ...     @stepcache.step_cached(name="ex.reset")
        ...     def value(self):
        ...         return 1
        >>> m = Meta()
        >>> m.value(), m.value()
        (1, 1)
        >>> stepcache.reset_stats()
        >>> row = stepcache.stats()["ex.reset"]
        >>> row.hits, row.misses, row.live_entries
        (0, 0, 1)
    """
    for fn in all_functions():
        fn.reset_counts()
