# SPDX-License-Identifier: Apache-2.0
"""What the benchmarks share beyond pyperf: the machine and the code they ran on
(:func:`machine`, :func:`source_state`), and the timing of the benchmarks that pair
their variants inside one process (interleaved, or round by round) rather than
through pyperf's worker processes (:mod:`benchmarks._pyperf`)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class Timing:
    """Nanoseconds per call (or per step) over repeated runs: median, min and max."""

    label: str
    median_ns: float
    min_ns: float
    max_ns: float

    @classmethod
    def of(cls, label: str, samples_ns: Sequence[float]) -> Timing:
        """The summary of ``samples_ns`` (one per repeated run)."""
        if not samples_ns:
            raise ValueError(f"{label}: no samples to summarise")
        return cls(
            label, statistics.median(samples_ns), min(samples_ns), max(samples_ns)
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "median_ns": self.median_ns,
            "min_ns": self.min_ns,
            "max_ns": self.max_ns,
        }


def environment() -> str:
    import numpy
    import torch

    return (
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"numpy {numpy.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.system()}"
    )


def machine() -> dict[str, Any]:
    """What the numbers were measured on: CPU model, cores, memory, Python, torch."""
    import numpy
    import torch

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count(),
        "memory_gib": _memory_gib(),
        "arch": platform.machine(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_version()} ({platform.python_implementation()})",
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return round(pages * size / 2**30, 1)


def source_state(own: Path | None = None) -> dict[str, Any]:
    """The code the numbers were measured on: ``git rev-parse HEAD``, and whether the
    tree had uncommitted changes (``dirty``, with the paths ``git status`` names).

    ``own``: the results file the run adds its sections to. Its uncommitted changes
    (an earlier section just written) are no change of the code: they are named
    under ``own_results_uncommitted``, not counted as dirty. Outside a git checkout
    (or without git) the commit is ``None``.
    """
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain")
    changed = [] if status is None else [line[3:] for line in status.splitlines()]
    mine = None  # the results file, as git names it (None: outside the checkout)
    if own is not None and (path := own.resolve()).is_relative_to(root):
        mine = path.relative_to(root).as_posix()
    dirty = [p for p in changed if p != mine]
    state: dict[str, Any] = {
        "commit": head.strip() if head else None,
        "dirty": bool(dirty) if status is not None else None,
        "dirty_paths": dirty,
    }
    if mine in changed:
        state["own_results_uncommitted"] = mine
    return state


def time_stmt(
    stmt: str,
    namespace: dict[str, Any],
    *,
    number: int = 200_000,
    repeats: int = 15,
) -> list[float]:
    """Time the statement ``stmt`` (run in ``namespace``) in a tight loop: ns per
    run of it, for each of ``repeats`` runs of ``number``.

    The statement runs as written at a call site (``m.index(buf)``), with no lambda
    around it; the cost of the empty loop is subtracted.
    """
    exec(stmt, namespace)  # warm: the first call is a miss
    empty = min(timeit.repeat("pass", number=number, repeat=5))
    return [
        (t - empty) / number * 1e9
        for t in timeit.repeat(stmt, globals=namespace, number=number, repeat=repeats)
    ]


@contextlib.contextmanager
def collector_paused() -> Iterator[Callable[[int], None]]:
    """Pause the cycle collector (a collection would land on whichever step runs at
    that moment); the function it yields, called with the round number, collects
    between rounds, every 16th."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()

    def between_rounds(r: int) -> None:
        if r % 16 == 15:
            gc.collect()

    try:
        yield between_rounds
    finally:
        if was_enabled:
            gc.enable()


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


#: the flag that makes a benchmark's module one timing process of a run
WORKER_FLAG = "--worker"


def in_fresh_process(module: str, spec: dict[str, Any]) -> Any:
    """Run ``python -m module --worker JSON`` (``spec`` as JSON) from the repository
    root and return what its last line of output holds, as JSON.

    A benchmark times in fresh processes where a process's memory layout and
    string-hash seed would favour some rows for its whole life. The process's
    standard error (its progress, or a traceback) passes through.
    """
    out = subprocess.run(
        [sys.executable, "-m", module, WORKER_FLAG, json.dumps(spec)],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.PIPE,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{module}: a timing process failed (exit {out.returncode}); its error "
            "is printed above"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def worker_spec(argv: Sequence[str] | None) -> dict[str, Any] | None:
    """The spec of :func:`in_fresh_process` if ``argv`` (default: ``sys.argv[1:]``)
    makes this process a worker, else ``None``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 2 and args[0] == WORKER_FLAG:
        spec: dict[str, Any] = json.loads(args[1])
        return spec
    return None
