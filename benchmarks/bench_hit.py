# SPDX-License-Identifier: Apache-2.0
"""Hit cost of stepcache against functools, cachetools and hand-written caches.

Run: ``python -m benchmarks.bench_hit [--markdown PATH]``. Every row is timed in the
same process, side by side, and reported as the median over repeated runs with min and
max; the goals are ratios of medians.
"""

from __future__ import annotations

import argparse
import functools
import operator
from pathlib import Path
from typing import Any

import cachetools
import torch

import stepcache
from benchmarks._timing import Timing, environment, progress, time_stmt
from stepcache import step_cached


class Meta:
    def __init__(self) -> None:
        self.query_start_loc = torch.arange(9, dtype=torch.int32)
        self._cachetools: dict[Any, Any] = {}
        self._hand: dict[Any, Any] = {}

    @step_cached(key="k")
    def sc_key(self, k: int) -> int:
        return k

    @step_cached(key="k", depends_on=("query_start_loc",))
    def sc_key_dep(self, k: int) -> int:
        return k

    @step_cached()
    def sc_getter(self) -> int:
        return 1

    @step_cached(depends_on=("query_start_loc",))
    def sc_getter_dep(self) -> int:
        return 1

    @functools.lru_cache  # noqa: B019 - the baseline being measured (default maxsize)
    def lru(self, k: int) -> int:
        return k

    @functools.cached_property
    def cprop(self) -> int:
        return 1

    @cachetools.cachedmethod(operator.attrgetter("_cachetools"))
    def ct(self, k: int) -> int:
        return k

    def hand(self, k: int) -> int:
        try:
            return self._hand[k]  # type: ignore[no-any-return]
        except KeyError:
            value = self._hand[k] = k
            return value


def run(number: int = 200_000, repeats: int = 15) -> dict[str, Timing]:
    m = Meta()
    ns: dict[str, Any] = {"m": m}
    cases = {
        "stepcache, key of one argument": "m.sc_key(3)",
        "stepcache, key + one tensor dependency": "m.sc_key_dep(3)",
        "stepcache, zero-argument getter": "m.sc_getter()",
        "stepcache, getter + one tensor dependency": "m.sc_getter_dep()",
        "functools.lru_cache": "m.lru(3)",
        "functools.cached_property": "m.cprop",
        "cachetools.cachedmethod": "m.ct(3)",
        "hand-written per-instance dict": "m.hand(3)",
    }
    out = {}
    for label, stmt in cases.items():
        progress(f"  timing {label} ...")
        out[label] = time_stmt(label, stmt, ns, number=number, repeats=repeats)
    with stepcache.debug("checks"):
        progress("  timing stepcache, key of one argument, checks mode ...")
        label = "stepcache, key of one argument, debug checks mode"
        out[label] = time_stmt(
            label, "m.sc_key(3)", ns, number=number // 10, repeats=repeats
        )
    return out


GOALS = [
    # (row, baseline, goal ratio)
    ("stepcache, key of one argument", "functools.lru_cache", 2.0),
    ("stepcache, key of one argument", "cachetools.cachedmethod", 0.2),
    ("stepcache, zero-argument getter", "functools.cached_property", 1.5),
    (
        "stepcache, key of one argument, debug checks mode",
        "stepcache, key of one argument",
        5.0,
    ),
]


def render(results: dict[str, Timing]) -> str:
    lines = [
        f"Environment: {environment()}",
        "",
        "| case | median ns/call | min | max |",
        "| --- | ---: | ---: | ---: |",
    ]
    for t in results.values():
        lines.append(
            f"| {t.label} | {t.median_ns:.0f} | {t.min_ns:.0f} | {t.max_ns:.0f} |"
        )
    lines += [
        "",
        "| ratio (medians) | measured | goal | met |",
        "| --- | ---: | ---: | :---: |",
    ]
    for row, base, goal in GOALS:
        r = results[row].ratio_to(results[base])
        lines.append(
            f"| {row} / {base} | {r:.2f}x | <= {goal}x | {'yes' if r <= goal else 'no'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--markdown", type=Path, help="also write the tables to this file"
    )
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    progress("bench_hit: ns per cache hit")
    text = render(run(args.number, args.repeats))
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
