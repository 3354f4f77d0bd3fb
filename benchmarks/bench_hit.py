# SPDX-License-Identifier: Apache-2.0
"""Hit cost of stepcache against functools, cachetools and hand-written caches.

Run: ``python -m benchmarks.bench_hit [--quick] [--processes N] [--markdown PATH]``.
Every row is timed in each of several fresh processes (5 by default, one after the
other), interleaved within a process (run 1 of every row, then run 2, ...), and
reported as the median over all runs with min and max. A goal is the median over the
processes of the ratio of the two rows' medians in one process: a process's memory
layout and string-hash seed move some rows by tens of percent for its whole life
(measured: a keyed hit over ``functools.lru_cache``, 1.6x-1.8x in most processes and
2.5x in one), which interleaving within one process cannot cancel.

Two groups of rows:

* the request index, DSv4's ``token_to_req_indices(buffer)``: stepcache's
  (:mod:`stepcache.integrations.dsv4.request_index`: a hit re-checks two tensors and an
  int and returns the stored tensor) against stock vLLM's method (the seeds'
  hand-written hit of vLLM PR 47474, the same hit branch as vLLM 0.33's
  ``CommonAttentionMetadata.token_to_req_indices``: three asserts and a new slice each
  call, :mod:`stepcache.integrations.dsv4.seed`, the seeds' code) and against a hand-written cache that keeps its slice
  (returns it and checks nothing: the floor of a cache that stores the result);
* a generic method (``return k``): stepcache keyed and unkeyed, with and without a
  tensor dependency, in disabled mode, against the plain undecorated method,
  ``functools.lru_cache``, ``functools.cached_property``, ``cachetools.cachedmethod``
  and two hand-written caches.

A goal has a limit set by an issue; a comparison is a ratio reported with no limit.
"""

from __future__ import annotations

import argparse
import functools
import json
import operator
import statistics
from pathlib import Path
from typing import Any

import attrs
import cachetools
import torch

import stepcache
from benchmarks._report import Goal, GoalResult, goals_table, markdown_table
from benchmarks._timing import (
    Case,
    Timing,
    case_runs,
    environment,
    in_fresh_process,
    progress,
    worker_spec,
)
from stepcache import step_cached
from stepcache.integrations.dsv4 import request_index, seed
from stepcache.integrations.dsv4 import sim as dsv4_sim


class Meta:
    def __init__(self) -> None:
        self.query_start_loc = torch.arange(9, dtype=torch.int32)
        self._cachetools: dict[Any, Any] = {}
        self._hand: dict[Any, Any] = {}
        self._attr: int | None = None

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

    def plain(self, k: int) -> int:
        return k

    def hand(self, k: int) -> int:
        try:
            return self._hand[k]  # type: ignore[no-any-return]
        except KeyError:
            value = self._hand[k] = k
            return value

    def attr_cache(self) -> int:
        value = self._attr
        if value is None:
            value = self._attr = 1
        return value


class KeptSliceMetadata(seed.SeedMetadata):
    """The seed's metadata with a cache that keeps the slice it returned and hands it
    back, checking nothing: in no seed, the floor a cache that stores its result can
    reach in Python."""

    _kept_slice: torch.Tensor | None = None

    def token_to_req_indices(self, buffer: torch.Tensor) -> torch.Tensor:
        kept = self._kept_slice
        if kept is None:
            kept = self._kept_slice = seed.handwritten_token_to_req_indices(
                self, buffer
            )
        return kept


# Row labels, used by the goals, the comparisons, the plot and the README's figures
# (benchmarks._readme). Each says what the timed call does.
RIX = (
    "request index: stepcache hit "
    "(re-checks 2 tensors, 1 int and its result's version; returns the stored tensor)"
)
RIX_INFERENCE = (
    "request index: stepcache hit, layout of inference tensors "
    "(re-checks 2 tensors' data pointer, shape, strides, dtype, device; 1 int; "
    "its result's version)"
)
RIX_SCOPE = (
    "request index: stepcache hit, layout of inference tensors, inside a scope "
    "(re-checks 2 tensors' identity, 1 int and its result's version)"
)
RIX_CHECKS = "request index: stepcache hit, checks mode"
RIX_SEED = (
    "request index: stock vLLM's method "
    "(the seeds' hand-written hit: 3 asserts + new slice each call)"
)
RIX_KEPT = (
    "request index: hand-written cache that keeps its slice (returns it, no checks)"
)
KEY = "stepcache, key of one argument"
KEY_CHECKS = "stepcache, key of one argument, checks mode"
KEY_DISABLED = (
    "stepcache, key of one argument, disabled mode (calls the function every time)"
)
PLAIN = "plain undecorated method (return k)"
GETTER = "stepcache, zero-argument getter"
LRU = "functools.lru_cache"
CPROP = "functools.cached_property"
CT = "cachetools.cachedmethod"


def _checks() -> Any:
    return stepcache.debug("checks")


def _scope() -> Any:
    return stepcache.scope()


def _disabled() -> Any:
    return stepcache.disabled()


def cases(number: int) -> list[Case]:
    """Every row: its label, the statement timed, and how many calls per run."""
    slow = max(number // 10, 1)
    return [
        Case(RIX, "rix(step, buf)", number),
        Case(RIX_INFERENCE, "rix(step_inference, buf)", number),
        # each run opens a scope: its first call joins the owner (a miss), then hits
        Case(RIX_SCOPE, "rix(step_scoped, buf)", number, _scope),
        Case(RIX_CHECKS, "rix(step_checks, buf)", slow, _checks),
        Case(RIX_SEED, "seed.token_to_req_indices(buf)", number),
        Case(RIX_KEPT, "kept.token_to_req_indices(buf)", number),
        Case(KEY, "m.sc_key(3)", number),
        Case(KEY_CHECKS, "m_checks.sc_key(3)", slow, _checks),
        Case(KEY_DISABLED, "m_off.sc_key(3)", number, _disabled),
        Case(PLAIN, "m.plain(3)", number),
        Case("stepcache, key + one tensor dependency", "m.sc_key_dep(3)", number),
        Case(GETTER, "m.sc_getter()", number),
        Case("stepcache, getter + one tensor dependency", "m.sc_getter_dep()", number),
        Case(LRU, "m.lru(3)", number),
        Case(CPROP, "m.cprop", number),
        Case(CT, "m.ct(3)", number),
        Case("hand-written per-instance dict", "m.hand(3)", number),
        Case("hand-written attribute cache", "m.attr_cache()", number),
    ]


def namespace() -> dict[str, Any]:
    """The objects the statements use: one step of 8 requests padded to 16 tokens.

    The checks-mode rows have owners of their own, so their entries are stored in
    checks mode, with the deep fingerprints a checks-mode hit compares. The layout of
    ``step_inference`` is made under ``torch.inference_mode()``, as a vLLM step makes
    its own tensors; the buffer, as vLLM's persistent buffers, is made outside.
    """
    lens = [3, 1, 1, 0, 2, 1, 1, 1]
    step = dsv4_sim.make_step(lens, pad_to=16)
    seed_meta = seed.SeedMetadata(step.query_start_loc, step.query_start_loc_cpu, 16)
    kept = KeptSliceMetadata(step.query_start_loc, step.query_start_loc_cpu, 16)
    with torch.inference_mode():
        inference_step = dsv4_sim.make_step(lens, pad_to=16)
        scoped_step = dsv4_sim.make_step(lens, pad_to=16)
    return {
        "m": Meta(),
        "m_checks": Meta(),
        "m_off": Meta(),
        "kept": kept,
        "step_checks": dsv4_sim.make_step(lens, pad_to=16),
        "step_inference": inference_step,
        "step_scoped": scoped_step,
        "rix": request_index.token_to_req_indices,
        "step": step,
        "seed": seed_meta,
        "buf": torch.zeros(64, dtype=torch.int32),
    }


GOALS = [
    Goal(RIX, RIX_SEED, 0.25, "issue 5"),
    Goal(RIX_SCOPE, RIX, 1.2, "issue 38"),
    Goal(KEY, LRU, 2.0, "issues 2, 5"),
    Goal(RIX_CHECKS, RIX, 5.0, "issues 3, 5"),
    Goal(KEY_CHECKS, KEY, 5.0, "issues 3, 5"),
    Goal(KEY, CT, 0.2, "issue 2"),
    Goal(GETTER, CPROP, 1.5, "issue 2"),
]

#: ratios reported with no limit (measured, baseline): what a reader needs to weigh
#: the goals against the cheapest alternatives and against switching caching off
COMPARISONS = [
    (RIX_SCOPE, RIX_SEED),
    (RIX_INFERENCE, RIX_SEED),
    (RIX_INFERENCE, RIX),
    (RIX, RIX_KEPT),
    (RIX_KEPT, RIX_SEED),
    (KEY_DISABLED, PLAIN),
    (KEY, PLAIN),
]


#: how many fresh processes a full run times the rows in
PROCESSES = 5


@attrs.frozen
class HitResults:
    #: every row's runs of all processes, pooled
    timings: dict[str, Timing]
    #: each goal checked on the median over the processes of its ratio
    goals: list[GoalResult]
    number: int
    #: runs per row in each process
    repeats: int
    #: each goal's ratio in each process (in the order of :data:`GOALS`)
    goal_ratios: tuple[tuple[float, ...], ...]
    #: each comparison's ratio in each process (in the order of :data:`COMPARISONS`)
    comparison_ratios: tuple[tuple[float, ...], ...] = ()

    def comparisons(self) -> list[tuple[str, str, float]]:
        """(measured, baseline, median over the processes of the ratio) of each
        comparison."""
        return [
            (measured, baseline, statistics.median(r))
            for (measured, baseline), r in zip(
                COMPARISONS, self.comparison_ratios, strict=True
            )
        ]

    @property
    def processes(self) -> int:
        return len(self.goal_ratios[0])

    def to_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "repeats": self.repeats,
            "processes": self.processes,
            "ns_per_call": {k: t.to_dict() for k, t in self.timings.items()},
            "goals": [
                {**g.to_dict(), "ratio_per_process": list(r)}
                for g, r in zip(self.goals, self.goal_ratios, strict=True)
            ],
            "comparisons": [
                {
                    "measured": measured,
                    "baseline": baseline,
                    "ratio": ratio,
                    "ratio_per_process": list(r),
                }
                for (measured, baseline, ratio), r in zip(
                    self.comparisons(), self.comparison_ratios, strict=True
                )
            ],
        }


def process_runs(number: int, repeats: int) -> dict[str, list[float]]:
    """Nanoseconds per call of every row in each of ``repeats`` runs, in this
    process."""
    runs = case_runs(cases(number), namespace(), repeats=repeats)
    Meta.lru.cache_clear()  # it holds the Meta object, and so its step cache, alive
    return runs


def run(number: int = 100_000, repeats: int = 21, processes: int = 1) -> HitResults:
    """Time every row: in this process (``processes=1``), or in ``processes`` fresh
    ones, one after the other."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1 (got {processes})")
    rows = len(cases(number))
    all_runs = []
    for i in range(processes):
        progress(
            f"bench_hit: {rows} rows, {repeats} interleaved runs"
            + (f", process {i + 1} of {processes}" if processes > 1 else "")
        )
        spec = {"number": number, "repeats": repeats}
        all_runs.append(
            process_runs(**spec)
            if processes == 1
            else in_fresh_process("benchmarks.bench_hit", spec)
        )
    timings = {
        label: Timing.of(label, [ns for runs in all_runs for ns in runs[label]])
        for label in all_runs[0]
    }

    def per_process(measured: str, baseline: str) -> tuple[float, ...]:
        return tuple(
            statistics.median(runs[measured]) / statistics.median(runs[baseline])
            for runs in all_runs
        )

    ratios = tuple(per_process(g.measured, g.baseline) for g in GOALS)
    goals = [g.check(statistics.median(r)) for g, r in zip(GOALS, ratios, strict=True)]
    compared = tuple(per_process(m, b) for m, b in COMPARISONS)
    return HitResults(timings, goals, number, repeats, ratios, compared)


def render(results: HitResults) -> str:
    rows = [
        [
            t.label,
            f"{t.median_ns:.0f}",
            f"{t.min_ns:.0f}",
            f"{t.max_ns:.0f}",
        ]
        for t in results.timings.values()
    ]
    spread = "; ".join(
        f"{g.goal.measured} / {g.goal.baseline}: {min(r):.2f}x-{max(r):.2f}x"
        for g, r in zip(results.goals, results.goal_ratios, strict=True)
    )
    compared = [
        [f"{measured} / {baseline}", f"{ratio:.2f}x"]
        for measured, baseline, ratio in results.comparisons()
    ]
    parts = [
        markdown_table(["call", "median ns/call", "min", "max"], rows, "lrrr"),
        goals_table(results.goals),
        markdown_table(
            ["comparison (ratio of medians, no goal)", "measured"], compared, "lr"
        ),
    ]
    if results.processes > 1:
        parts.append(
            f"Each goal is the median over {results.processes} processes of the "
            "ratio of the two rows' medians in one process. The ratios of the "
            f"processes ranged: {spread}."
        )
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    spec = worker_spec(argv)
    if spec is not None:  # one timing process of a run
        torch.set_num_threads(1)
        print(json.dumps(process_runs(**spec)))
        return
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument(
        "--markdown", type=Path, help="also write the tables to this file"
    )
    parser.add_argument("--number", type=int, default=100_000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=21, help="runs per row")
    parser.add_argument(
        "--processes",
        type=int,
        default=PROCESSES,
        help="fresh processes to time the rows in, one after the other",
    )
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    number, repeats = (2_000, 3) if args.quick else (args.number, args.repeats)
    processes = 1 if args.quick else args.processes
    print(f"Environment: {environment()}")
    text = render(run(number, repeats, processes))
    print(text)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
