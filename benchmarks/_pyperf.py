# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' harness: pyperf runs them, this module pairs them into rows.

A benchmark module names its benchmarks (a function that prepares one, in the worker
process that runs it, and returns pyperf's ``loops -> seconds`` time function) and its
rows (two benchmarks; a limit where an issue set one). :func:`main` runs every side of
the rows through ``pyperf.Runner`` (worker processes, calibrated loops, a warm-up,
then values), then compares each row's two sides with ``python -m pyperf compare_to``
and writes a results file: each row's ratio of medians and compare_to's verdict, each
benchmark's median, min and max, pyperf's metadata of the machine, the commit and the
command.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import attrs
import pyperf  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
#: pyperf's ``loops -> seconds``, and what makes one in its worker
TimeFunc = Callable[[int], float]
Prepare = Callable[[], TimeFunc]
#: pyperf metadata that says what the numbers were measured on
MACHINE_KEYS = (
    "cpu_model_name",
    "cpu_count",
    "cpu_affinity",
    "platform",
    "python_version",
    "perf_version",
    "torch",
    "torch_threads",
)


@attrs.frozen
class Row:
    """``measured / baseline``, on the medians of two benchmarks; ``label`` says what
    each side does; a goal where ``limit`` is set."""

    key: str
    label: str
    measured: str
    baseline: str
    limit: float | None = None
    set_by: str = ""


def looped(step: Callable[[Any], object], arg: Any) -> TimeFunc:
    """A time function that calls ``step(arg)`` ``loops`` times."""

    def time_func(loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            step(arg)
        return time.perf_counter() - start

    return time_func


#: what a timed statement runs inside, entered around each value
Mode = Callable[[], AbstractContextManager[Any]]
#: loops of the empty statement whose time per loop is subtracted
EMPTY_LOOPS = 100_000


def statement(
    stmt: str, namespace: Callable[[], dict[str, Any]], mode: Mode | None = None
) -> Prepare:
    """The statement ``stmt`` as written at a call site (no lambda around it), run in
    ``namespace()`` inside ``mode()``: its first call made (a miss), then timed, the
    cost of an empty loop of the same length subtracted."""

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


def source_state(own: Path | None = None) -> dict[str, Any]:
    """The code measured: ``git rev-parse HEAD`` and the paths ``git status`` names
    (``dirty``). ``own``, a results file a run adds sections to, is no change of the
    code: it is named ``own_results_uncommitted`` instead. No git: commit ``None``."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain")
    changed = [] if status is None else [line[3:] for line in status.splitlines()]
    mine = None
    if own is not None and (path := own.resolve()).is_relative_to(ROOT):
        mine = path.relative_to(ROOT).as_posix()
    dirty = [p for p in changed if p != mine]
    state: dict[str, Any] = {
        "commit": head.strip() if head else None,
        "dirty": bool(dirty) if status is not None else None,
        "dirty_paths": dirty,
    }
    if mine in changed:
        state["own_results_uncommitted"] = mine
    return state


def machine(metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The machine as pyperf describes it: from a benchmark's metadata, or collected
    now (pyperf collects it for every run it makes)."""
    if metadata is None:
        import torch

        run = pyperf.Run([1.0], metadata={"name": "machine"})
        metadata = {
            **pyperf.Benchmark([run]).get_metadata(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
        }
    return {k: metadata[k] for k in MACHINE_KEYS if k in metadata}


def header(command: Sequence[str], started: float) -> dict[str, Any]:
    """The command, date and commit a results file records."""
    when = datetime.datetime.fromtimestamp(started, datetime.UTC)
    return {
        "command": shlex.join(command),
        "date": f"{when:%Y-%m-%d %H:%M} UTC",
        "minutes": round((time.time() - started) / 60, 1),
        "source": source_state(),
    }


def summary(bench: Any) -> dict[str, Any]:
    """A pyperf benchmark's values, in nanoseconds per loop."""
    values = [v * 1e9 for v in bench.get_values()]
    runs = [run for run in bench.get_runs() if run.values]  # not the calibration
    return {
        "median_ns": bench.median() * 1e9,
        "min_ns": min(values),
        "max_ns": max(values),
        "processes": len(runs),
        "values": len(values),
    }


_VERDICT = re.compile(r"^(Significant|Not significant)(?: \(t=(-?[\d.]+)\))?", re.M)


def compare_to(name: str, measured: Any, baseline: Any, folder: Path) -> dict[str, Any]:
    """``python -m pyperf compare_to -v`` on the two sides, saved under one benchmark
    name in two files: its first line and its Student's t-test at 95%."""
    files = []
    for side, bench in (("baseline", baseline), ("measured", measured)):
        renamed = pyperf.Benchmark(bench.get_runs())  # runs are immutable: shared
        renamed.update_metadata({"name": name})
        path = folder / f"{side}.json"
        pyperf.BenchmarkSuite([renamed]).dump(str(path), replace=True)
        files.append(str(path))
    out = subprocess.run(
        [sys.executable, "-m", "pyperf", "compare_to", "-v", *files],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = _VERDICT.search(out)
    return {
        "compare_to": out.strip().splitlines()[0],
        "significant": None if found is None else found[1] == "Significant",
        "t_score": None if found is None or found[2] is None else float(found[2]),
    }


def row_result(row: Row, done: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    measured, baseline = done[row.measured], done[row.baseline]
    ratio = measured.median() / baseline.median()
    (folder / row.key).mkdir(parents=True, exist_ok=True)
    return {
        **attrs.asdict(row),
        "ratio": ratio,
        "met": None if row.limit is None else ratio <= row.limit,
        **compare_to(row.key, measured, baseline, folder / row.key),
    }


def _lazy(prepare: Prepare) -> TimeFunc:
    """Prepared at its first call: in the worker that runs it, untimed."""
    made: list[TimeFunc] = []

    def time_func(loops: int) -> float:
        if not made:
            made.append(prepare())
        return made[0](loops)

    return time_func


def main(
    module: str,
    benches: Mapping[str, Prepare],
    rows: Sequence[Row],
    *,
    processes: int,
    values: int,
    results: Path,
    argv: Sequence[str] | None = None,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Run the two sides of every row (of those whose label holds ``--rows``) with
    pyperf, each row's sides one after the other, and write the results file
    (``--results``, default ``results``); ``extra()`` adds to it. ``module`` is what
    follows ``python -m`` (a module, and a subcommand where it has one)."""
    import torch

    torch.set_num_threads(1)

    def worker_args(cmd: list[str], args: Any) -> None:
        cmd.extend(("--rows", args.rows))  # the workers register the same benchmarks

    runner = pyperf.Runner(
        processes=processes,
        values=values,
        program_args=("-m", *module.split()),
        add_cmdline_args=worker_args,
        metadata={"torch": torch.__version__, "torch_threads": 1},
    )
    runner.argparser.add_argument("--results", type=Path, default=results)
    runner.argparser.add_argument("--rows", default="", help="rows whose label has it")
    args = runner.parse_args(None if argv is None else list(argv))
    chosen = [r for r in rows if args.rows in r.label]
    names = list(dict.fromkeys(n for r in chosen for n in (r.measured, r.baseline)))
    started = time.time()
    added = {} if args.worker or extra is None else extra()
    done = {}
    for name in names:
        bench = runner.bench_time_func(name, _lazy(benches[name]))
        if bench is not None:
            done[name] = bench
    if args.worker:
        return 0
    given = sys.argv[1:] if argv is None else list(argv)
    with tempfile.TemporaryDirectory() as tmp:
        compared = [row_result(r, done, Path(tmp)) for r in chosen]
    out = {
        **header(["python", "-m", module, *given], started),
        "machine": machine(done[names[0]].get_metadata()),
        **added,
        "benchmarks": {n: summary(done[n]) for n in names},
        "rows": compared,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(out, indent=1) + "\n")
    for r in compared:
        print(f"{r['ratio']:.2f}x  {r['label']}  ({r['compare_to']})")
    print(f"{module}: wrote {args.results}")
    return 0


def run_module(
    module: str, results: Path, options: Sequence[str] = ()
) -> dict[str, Any]:
    """``python -m module`` in a process of its own (pyperf allows one runner per
    process), with pyperf ``options``; the results it wrote."""
    subprocess.run(
        [sys.executable, "-m", *module.split(), "--quiet", "--results", str(results)]
        + list(options),
        cwd=ROOT,
        check=True,
    )
    loaded: dict[str, Any] = json.loads(results.read_text())
    return loaded
