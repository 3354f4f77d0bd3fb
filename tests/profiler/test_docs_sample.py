# SPDX-License-Identifier: Apache-2.0
"""docs/profiler.md's command-line sample is what a run prints, but for its times:
``python -m benchmarks.bench_profiler --docs`` writes it; this checks the counts."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_profiler  # noqa: E402


def test_the_docs_sample_is_a_run() -> None:
    block = bench_profiler.current_block(bench_profiler.PAGE.read_text())
    text = block.split("```text\n", 1)[1].split("```", 1)[0]
    shown = text.split("\n", 1)[1]  # after the command line
    run = bench_profiler.run_text()
    assert bench_profiler.comparable(shown) == bench_profiler.comparable(run), (
        "docs/profiler.md's sample no longer matches a run: "
        "python -m benchmarks.bench_profiler --docs"
    )


def test_comparable_masks_times_only() -> None:
    a = "8 step(s), 424 call(s) in 64.63 ms; overhead 22.44 ms (52.9 us per call, 35% of the run)"
    b = "8 step(s), 424 call(s) in 9.10 ms; overhead 1.00 s (812 ns per call, 7% of the run)"
    assert bench_profiler.comparable(a) == bench_profiler.comparable(b)
    assert bench_profiler.comparable(a) != bench_profiler.comparable(
        a.replace("424", "425")
    )
