# SPDX-License-Identifier: Apache-2.0
"""Benchmark (not a test): what profiling costs on the DSv4 simulation.

Runs the uncached DSv4 workload plain and under ``stepcache.profile`` (with and
without result digests), several times each, and prints the best CPU time of this
thread (``time.thread_time_ns``: not inflated by other processes or by torch's
spinning worker threads) per run, the measured cost per profiled call, and what the
report says it cost itself. Run from a clone's root::

    python -m tests.profiler.bench_overhead [steps] [repeats]
"""

from __future__ import annotations

import sys
import time

import torch

import stepcache
from stepcache.integrations.dsv4 import sim as dsv4_sim
from stepcache.profiler import ProfileReport

from . import workloads

TARGETS = (
    "stepcache.integrations.dsv4.sim",
    "stepcache.integrations.dsv4.request_index",
)


def plain(steps: int) -> int:
    t = time.thread_time_ns()
    workloads.dsv4("uncached", steps=steps)
    return time.thread_time_ns() - t


def profiled(steps: int, results: bool) -> tuple[int, ProfileReport]:
    with stepcache.profile(TARGETS, step=dsv4_sim.run_step, results=results) as report:
        t = time.thread_time_ns()
        workloads.dsv4("uncached", steps=steps)
        spent = time.thread_time_ns() - t
    return spent, report


def main(argv: list[str]) -> None:
    steps = int(argv[0]) if argv else 40
    repeats = int(argv[1]) if len(argv) > 1 else 7
    torch.set_num_threads(1)
    plain(steps)  # warm up torch
    base = min(plain(steps) for _ in range(repeats))
    print(f"DSv4 simulation, {steps} steps, uncached: {base / 1e6:.1f} ms CPU")
    for results in (True, False):
        runs = [profiled(steps, results) for _ in range(repeats)]
        spent = min(r[0] for r in runs)
        report = runs[0][1]
        own = min(r[1].overhead_ns for r in runs)
        print(
            f"profiled (results={results}): {spent / 1e6:.1f} ms CPU, "
            f"{report.calls} calls: +{(spent - base) / report.calls / 1e3:.1f} us per "
            f"call measured, {own / report.calls / 1e3:.1f} us per call self-reported; "
            f"wrap+restore {min(r[1].setup_ns for r in runs) / 1e6:.1f} ms, "
            f"analysis {min(r[1].analysis_ns for r in runs) / 1e6:.1f} ms"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
