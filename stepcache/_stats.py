# SPDX-License-Identifier: Apache-2.0
"""Process-wide counters per decorated function, and their table."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs

from stepcache._registry import all_functions
from stepcache._sizes import nbytes
from stepcache._store import live_caches

__all__ = ["FunctionStats", "StatsTable", "reset_stats", "stats"]


@attrs.frozen
class FunctionStats:
    """Counters of one decorated function across the process."""

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


@attrs.frozen
class StatsTable(Mapping[str, FunctionStats]):
    """Stats per decorated function, by name; ``str()`` renders a readable table."""

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
            r.name: {
                "hits": r.hits,
                "misses": r.misses,
                "bypasses": r.bypasses,
                "invalidations": r.invalidations,
                "live_entries": r.live_entries,
                "live_bytes": r.live_bytes,
            }
            for r in self.rows
        }

    def __str__(self) -> str:
        body = [
            (
                r.name,
                str(r.hits),
                str(r.misses),
                str(r.bypasses),
                str(r.invalidations),
                str(r.live_entries),
                _human(r.live_bytes),
            )
            for r in self.rows
        ]
        if not body:
            return "stepcache: no decorated function has been called"
        widths = [
            max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(_COLUMNS)
        ]
        lines = [
            "  ".join(
                _pad(c, w, i)
                for i, (c, w) in enumerate(zip(_COLUMNS, widths, strict=True))
            )
        ]
        lines.append("  ".join("-" * w for w in widths))
        for b in body:
            lines.append(
                "  ".join(
                    _pad(c, w, i)
                    for i, (c, w) in enumerate(zip(b, widths, strict=True))
                )
            )
        return "\n".join(lines)


def _pad(text: str, width: int, column: int) -> str:
    return text.ljust(width) if column == 0 else text.rjust(width)


def _human(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024 or unit == "MiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def stats(*, include_idle: bool = False) -> StatsTable:
    """Counters per decorated function across the process.

    ``include_idle`` keeps functions that were never called.

    >>> import stepcache
    >>> table = stepcache.stats()
    >>> isinstance(str(table), str)
    True
    """
    live: dict[int, list[int]] = {}
    for store in live_caches():
        for fid, entry in store.entries():
            acc = live.setdefault(fid, [0, 0])
            acc[0] += 1
            acc[1] += nbytes(entry[0])
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
    """Zero every function's counters (live entries are not touched)."""
    for fn in all_functions():
        fn.reset_counts()
