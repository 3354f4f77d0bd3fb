# SPDX-License-Identifier: Apache-2.0
"""Pairs of pyperf benchmarks: what pyperf does not do for the benchmarks that use it.

pyperf runs each benchmark in worker processes of its own (calibration, warm-up, a
few values per process); this module adds what a goal needs on top: a row compares
two benchmarks of the same run (the ratio of their medians, and the significance
test of ``pyperf compare_to``), the results are written with the commit, the
command, the date and the machine, and a benchmark module runs in a process of its
own (pyperf allows one runner per process).
"""

from __future__ import annotations

import datetime
import json
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pyperf  # type: ignore[import-untyped]
from pyperf._utils import (  # type: ignore[import-untyped]
    is_significant,  # the test `pyperf compare_to` runs
)

from benchmarks._report import markdown_table
from benchmarks._timing import machine, source_state

__all__ = [
    "Bench",
    "Row",
    "goal_rows",
    "register",
    "results_header",
    "row_result",
    "rows_table",
    "run_module",
    "runner",
    "summaries_table",
    "summary",
]

ROOT = Path(__file__).resolve().parents[1]

#: ``loops -> seconds``: what ``pyperf.Runner.bench_time_func`` times
TimeFunc = Callable[[int], float]


@attrs.frozen
class Bench:
    """One benchmark: its name and a function that prepares it (in the worker that
    runs it, untimed) and returns its time function."""

    name: str
    prepare: Callable[[], TimeFunc]


@attrs.frozen
class Row:
    """A ratio of two benchmarks' medians; a goal when it has a limit."""

    label: str
    measured: str
    baseline: str
    limit: float | None = None
    set_by: str = ""


def _lazy(prepare: Callable[[], TimeFunc]) -> TimeFunc:
    made: list[TimeFunc] = []

    def time_func(loops: int) -> float:
        if not made:
            made.append(prepare())
        return made[0](loops)

    return time_func


def register(runner: pyperf.Runner, benches: Sequence[Bench]) -> dict[str, Any]:
    """Run ``benches`` through ``runner`` in their order; in the main process, the
    pyperf benchmarks by name (a worker gets ``{}``)."""
    done: dict[str, Any] = {}
    for bench in benches:
        result = runner.bench_time_func(bench.name, _lazy(bench.prepare))
        if result is not None:
            done[bench.name] = result
    return done


def summary(bench: Any) -> dict[str, Any]:
    """A pyperf benchmark's values, in nanoseconds per loop."""
    values = [v * 1e9 for v in bench.get_values()]
    return {
        "median_ns": statistics.median(values),
        "min_ns": min(values),
        "max_ns": max(values),
        "values": len(values),
        # the runs with values: pyperf's calibration run has none
        "processes": sum(1 for run in bench.get_runs() if run.values),
        "loops": bench.get_runs()[-1].get_loops(),
    }


def row_result(row: Row, benches: dict[str, Any]) -> dict[str, Any]:
    """A row's ratio of medians, its limit and whether it is met, and whether the two
    samples differ significantly (Student's two-sample t-test at 95%, as
    ``pyperf compare_to``)."""
    measured, baseline = benches[row.measured], benches[row.baseline]
    ratio = measured.median() / baseline.median()
    a, b = measured.get_values(), baseline.get_values()
    significant, t_score = (
        is_significant(a, b) if len(a) == len(b) and len(a) > 1 else (None, None)
    )
    return {
        "label": row.label,
        "measured": row.measured,
        "baseline": row.baseline,
        "ratio": ratio,
        "limit": row.limit,
        "met": None if row.limit is None else ratio <= row.limit,
        "set_by": row.set_by,
        "significant": significant,
        "t_score": t_score,
    }


def results_header(command: Sequence[str], started: float) -> dict[str, Any]:
    """The commit, command, date and machine a results file records."""
    return {
        "command": shlex.join(command),
        "date": f"{datetime.datetime.fromtimestamp(started, datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "minutes": (time.time() - started) / 60,
        "source": source_state(),
        "machine": machine(),
        "pyperf": pyperf.__version__,
    }


def runner(module: str, *, processes: int, values: int, results: Path) -> pyperf.Runner:
    """A runner for ``python -m module`` with two options of its own: ``--results
    PATH`` (default ``results``) and ``--rows TEXT`` (only the rows whose label holds
    it; passed on to the workers, which must register the same benchmarks)."""

    def worker_args(cmd: list[str], args: Any) -> None:
        if args.rows:
            cmd.extend(("--rows", args.rows))

    made = pyperf.Runner(
        processes=processes,
        values=values,
        program_args=("-m", module),
        add_cmdline_args=worker_args,
    )
    made.argparser.add_argument(
        "--results", type=Path, default=results, help=f"JSON to write ({results})"
    )
    made.argparser.add_argument(
        "--rows", default="", help="only the rows whose label contains this text"
    )
    return made


def run_module(
    module: str, results: Path, options: Sequence[str] = ()
) -> dict[str, Any]:
    """Run ``python -m module`` in a process of its own, with pyperf ``options``;
    its results, as it wrote them to ``results``."""
    subprocess.run(
        [sys.executable, "-m", module, "--quiet", "--results", str(results), *options],
        cwd=ROOT,
        check=True,
    )
    loaded: dict[str, Any] = json.loads(results.read_text())
    return loaded


def rows_table(rows: Sequence[dict[str, Any]], header: str, *, goals: bool) -> str:
    """Rows of a results file (:func:`row_result`) as Markdown: the ratio, whether
    the two samples differ significantly, and for ``goals`` the limit, whether it is
    met and who set it."""
    table = []
    for r in rows:
        cells = [r["label"], f"{r['ratio']:.2f}x"]
        if goals:
            met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
            limit = "" if r["limit"] is None else f"<= {r['limit']:g}x"
            cells += [limit, met]
        cells.append({True: "yes", False: "no", None: "n/a"}[r["significant"]])
        table.append([*cells, *([r["set_by"]] if goals else [])])
    columns = [header, "measured"]
    columns += ["limit", "met", "significant", "set by"] if goals else ["significant"]
    return markdown_table(columns, table, "lrrccl" if goals else "lrc")


def summaries_table(benchmarks: dict[str, dict[str, Any]], header: str) -> str:
    """The benchmarks of a results file (:func:`summary`) as Markdown."""
    return markdown_table(
        [header, "median ns", "min", "max", "processes x values"],
        [
            [
                name,
                f"{s['median_ns']:.0f}",
                f"{s['min_ns']:.0f}",
                f"{s['max_ns']:.0f}",
                f"{s['processes']} x {s['values'] // max(s['processes'], 1)}",
            ]
            for name, s in benchmarks.items()
        ],
        "lrrrr",
    )


def goal_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The rows with a limit, as rows of the benchmarks page's goals table (a row's
    label, ratio, limit, met, set by)."""
    return "\n".join(
        f"| {r['label']} | {r['ratio']:.2f}x | <= {r['limit']:g}x | "
        f"{'yes' if r['met'] else '**no**'} | {r['set_by']} |"
        for r in rows
        if r["limit"] is not None
    )
