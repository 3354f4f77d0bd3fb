# SPDX-License-Identifier: Apache-2.0
"""The ranking is the same on identical runs, and one stalled call does not make a
function's time: the figures compare across runs."""

from __future__ import annotations

import time

import stepcache
from stepcache.integrations.dsv4 import sim as dsv4_sim
from stepcache.profiler import ProfileReport

from . import workloads

TARGETS = (
    "stepcache.integrations.dsv4.sim",
    "stepcache.integrations.dsv4.request_index",
)


def _run() -> ProfileReport:
    with stepcache.profile(TARGETS, step=dsv4_sim.run_step) as report:
        workloads.dsv4_uncached()
    return report


def test_identical_runs_rank_alike() -> None:
    first, second = _run(), _run()
    assert [r.name for r in first.functions] == [r.name for r in second.functions]
    assert [r.redundant for r in first.functions] == [
        r.redundant for r in second.functions
    ]


class Slow:
    """Its first call stalls (an import, a first dispatch): the rest take no time."""

    calls = 0

    @classmethod
    def value(cls, x: int) -> int:
        cls.calls += 1
        if cls.calls == 1:
            time.sleep(0.05)
        return x


def test_a_stalled_first_call_is_not_the_call_time() -> None:
    # two calls: the median of two would be half the stall (the 15.77 ms)
    Slow.calls = 0
    with stepcache.profile(Slow) as report:
        Slow.value(1)
        Slow.value(1)
    row = report["Slow.value"]
    assert row.redundant == 1
    assert row.total_ns >= 50_000_000
    assert row.median_ns < 10_000_000
    assert row.redundant_ns < 10_000_000


def test_the_first_calls_are_left_out_of_the_call_time() -> None:
    Slow.calls = 0
    with stepcache.profile(Slow) as report:
        for _ in range(4):
            Slow.value(1)
    row = report["Slow.value"]
    assert row.redundant == 3
    assert row.redundant_ns < 30_000_000
