# SPDX-License-Identifier: Apache-2.0
"""Hit cost of stepcache against functools, cachetools and hand-written caches.

Run: ``python -m benchmarks.bench_hit [--fast] [--results PATH] [--rows TEXT]`` (and
any other ``pyperf`` option: ``-p`` processes, ``-n`` values per process, ...).
Every benchmark is one statement as written at a call site (``m.sc_key(3)``, no
lambda around it), timed by pyperf in worker processes of its own (loops calibrated,
one warm-up, then values), after its first call (a miss), with the cost of an empty
loop of the same length subtracted. A row compares two benchmarks of one pyperf run,
the two sides one after the other: the ratio of their medians, with the significance
test of ``pyperf compare_to``. A process's memory layout and string-hash seed move
some benchmarks by tens of percent for its whole life (measured with the earlier
harness: a keyed hit over ``functools.lru_cache``, 1.6x-1.8x in most processes and
2.5x in one), so each is timed in several processes and its values pooled.

Two groups of benchmarks:

* the request index, DSv4's ``token_to_req_indices(buffer)``: stepcache's
  (:mod:`stepcache.integrations.dsv4.request_index`: a hit re-checks two tensors and an
  int and returns the stored tensor) against stock vLLM's method (the seeds'
  hand-written hit of vLLM PR 47474, the same hit branch as vLLM 0.33's
  ``CommonAttentionMetadata.token_to_req_indices``: three asserts and a new slice each
  call, :mod:`stepcache.integrations.dsv4.seed`, the seeds' code) and against a
  hand-written cache that keeps its slice (returns it and checks nothing: the floor of
  a cache that stores the result);
* a generic method (``return k``): stepcache keyed and unkeyed, with and without a
  tensor dependency, in disabled mode, against the plain undecorated method,
  ``functools.lru_cache``, ``functools.cached_property``, ``cachetools.cachedmethod``
  and two hand-written caches.

A goal is a row with a limit set by an issue; a comparison is a row with no limit.
"""

from __future__ import annotations

import contextlib
import functools
import json
import operator
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import cachetools
import torch

import stepcache
from benchmarks import _pyperf
from benchmarks._pyperf import Bench, Row, TimeFunc
from benchmarks._timing import Timing
from stepcache import step_cached
from stepcache.integrations.dsv4 import request_index, seed
from stepcache.integrations.dsv4 import sim as dsv4_sim

MODULE = "benchmarks.bench_hit"
RESULTS = _pyperf.ROOT / "docs" / "benchmarks" / "hit.json"
#: worker processes per benchmark (``--fast``: half), values per process
PROCESSES, VALUES = 6, 3
#: loops of the empty statement whose time per loop is subtracted
EMPTY_LOOPS = 100_000


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


#: what a benchmark's statement runs inside, entered around each value
Mode = Callable[[], AbstractContextManager[Any]]
CHECKS: Mode = functools.partial(stepcache.debug, "checks")

#: every benchmark: its label, the statement timed, and the mode it runs in
CALLS: list[tuple[str, str, Mode | None]] = [
    (RIX, "rix(step, buf)", None),
    (RIX_INFERENCE, "rix(step_inference, buf)", None),
    # each value opens a scope: its first call joins the owner (a miss), then hits
    (RIX_SCOPE, "rix(step_scoped, buf)", stepcache.scope),
    (RIX_CHECKS, "rix(step_checks, buf)", CHECKS),
    (RIX_SEED, "seed.token_to_req_indices(buf)", None),
    (RIX_KEPT, "kept.token_to_req_indices(buf)", None),
    (KEY, "m.sc_key(3)", None),
    (KEY_CHECKS, "m_checks.sc_key(3)", CHECKS),
    (KEY_DISABLED, "m_off.sc_key(3)", stepcache.disabled),
    (PLAIN, "m.plain(3)", None),
    ("stepcache, key + one tensor dependency", "m.sc_key_dep(3)", None),
    (GETTER, "m.sc_getter()", None),
    ("stepcache, getter + one tensor dependency", "m.sc_getter_dep()", None),
    (LRU, "m.lru(3)", None),
    (CPROP, "m.cprop", None),
    (CT, "m.ct(3)", None),
    ("hand-written per-instance dict", "m.hand(3)", None),
    ("hand-written attribute cache", "m.attr_cache()", None),
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


def statement(stmt: str, mode: Mode | None) -> Callable[[], TimeFunc]:
    """Prepare the timing of ``stmt`` in a fresh :func:`namespace`, inside ``mode()``:
    its first call made (a miss), the empty loop's cost per loop measured."""

    def prepare() -> TimeFunc:
        enter = mode or contextlib.nullcontext
        globals_ = namespace()
        with enter():
            exec(stmt, globals_)
        timer = timeit.Timer(stmt, globals=globals_)
        empty = timeit.Timer("pass")
        per_loop = min(empty.timeit(EMPTY_LOOPS) for _ in range(5)) / EMPTY_LOOPS

        def time_func(loops: int) -> float:
            with enter():
                seconds = timer.timeit(loops)
            return seconds - per_loop * loops

        return time_func

    return prepare


BENCHES: dict[str, Bench] = {
    label: Bench(label, statement(stmt, mode)) for label, stmt, mode in CALLS
}


def _row(
    measured: str, baseline: str, limit: float | None = None, set_by: str = ""
) -> Row:
    return Row(f"{measured} / {baseline}", measured, baseline, limit, set_by)


GOALS = [
    _row(RIX, RIX_SEED, 0.25, "issue 5"),
    _row(RIX_SCOPE, RIX, 1.2, "issue 38"),
    _row(KEY, LRU, 1.6, "issue 56"),
    _row(RIX_CHECKS, RIX, 4.0, "issue 56"),
    _row(KEY_CHECKS, KEY, 5.0, "issues 3, 5"),
    _row(KEY, CT, 0.2, "issue 2"),
    _row(GETTER, CPROP, 1.5, "issue 2"),
]

#: rows with no limit: what a reader needs to weigh the goals against the cheapest
#: alternatives and against switching caching off
COMPARISONS = [
    _row(RIX_SCOPE, RIX_SEED),
    _row(RIX_INFERENCE, RIX_SEED),
    _row(RIX_INFERENCE, RIX),
    _row(RIX, RIX_KEPT),
    _row(RIX_KEPT, RIX_SEED),
    _row(KEY_DISABLED, PLAIN),
    _row(KEY, PLAIN),
]


def selected(rows: str) -> tuple[list[Row], list[Row], list[str]]:
    """The goals and comparisons whose label contains ``rows``, and the benchmarks to
    run in their order: each row's two sides one after the other, then (with no
    ``rows`` given) the benchmarks of no row."""
    goals = [r for r in GOALS if rows in r.label]
    comparisons = [r for r in COMPARISONS if rows in r.label]
    sides = [n for r in goals + comparisons for n in (r.measured, r.baseline)]
    names = list(dict.fromkeys([*sides, *([] if rows else BENCHES)]))
    return goals, comparisons, names


@attrs.frozen
class HitResults:
    """The benchmarks of a results file, as :mod:`benchmarks._plots` plots them."""

    timings: dict[str, Timing]

    @classmethod
    def of(cls, results: dict[str, Any]) -> HitResults:
        return cls(
            {
                name: Timing(name, s["median_ns"], s["min_ns"], s["max_ns"])
                for name, s in results["ns_per_call"].items()
            }
        )


def render(results: dict[str, Any]) -> str:
    """The benchmarks, goals and comparisons of a results file, as Markdown."""
    return "\n\n".join(
        [
            _pyperf.summaries_table(results["ns_per_call"], "call (ns per call)"),
            _pyperf.rows_table(results["goals"], "goal (ratio of medians)", goals=True),
            _pyperf.rows_table(
                results["comparisons"],
                "comparison (ratio of medians, no goal)",
                goals=False,
            ),
        ]
    )


def run(results: Path, options: Sequence[str] = ()) -> dict[str, Any]:
    """Run this benchmark in a process of its own, with pyperf ``options``; its
    results, as written to ``results``."""
    return _pyperf.run_module(MODULE, results, options)


def main(argv: Sequence[str] | None = None) -> int:
    runner = _pyperf.runner(MODULE, processes=PROCESSES, values=VALUES, results=RESULTS)
    args = runner.parse_args(None if argv is None else list(argv))
    torch.set_num_threads(1)
    goals, comparisons, names = selected(args.rows)
    started = time.time()
    done = _pyperf.register(runner, [BENCHES[n] for n in names])
    if args.worker:
        return 0
    given = sys.argv[1:] if argv is None else list(argv)
    results = {
        **_pyperf.results_header(["python", "-m", MODULE, *given], started),
        "ns_per_call": {n: _pyperf.summary(done[n]) for n in names},
        "goals": [_pyperf.row_result(r, done) for r in goals],
        "comparisons": [_pyperf.row_result(r, done) for r in comparisons],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(render(results))
    print(f"\nbench_hit: wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
