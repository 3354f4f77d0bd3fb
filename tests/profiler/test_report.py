# SPDX-License-Identifier: Apache-2.0
"""The report as a table and as JSON, with the profiler's own overhead."""

from __future__ import annotations

import json

import pytest

import stepcache
from stepcache.profiler import ProfileReport

from . import sample

MOD = sample.__name__


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    with stepcache.profile(MOD, step_by="step") as report:
        sample.run([[1, 2], [3, 1, 1], [2]])
    return report


def test_overhead_is_measured(report: ProfileReport) -> None:
    assert report.calls == sum(r.calls for r in report.functions)
    assert report.overhead_ns > 0 and report.setup_ns > 0 and report.analysis_ns > 0
    assert report.overhead_per_call_ns == report.overhead_ns / report.calls
    # The profiler's cost is not counted in the functions' time, and the overhead is
    # that of the run: closing the last step after the block is analysis. Both are
    # parts of the block's wall time, so they add up to at most that (no tolerance:
    # the parts are measured back to back).
    assert report.wall_ns > report["run"].total_ns
    assert report["run"].total_ns + report.overhead_ns <= report.wall_ns


def test_table(report: ProfileReport) -> None:
    text = report.table()
    lines = text.splitlines()
    assert lines[0].startswith(
        f"stepcache profile: {report.steps} step(s), {report.calls} call(s)"
    )
    assert "profiler overhead" in lines[0]
    header = next(i for i, line in enumerate(lines) if line.startswith("#"))
    rows = lines[header + 2 : header + 2 + len(report)]
    assert [r.split()[1] for r in rows] == [f.name for f in report.functions]
    build = report["Builder.build"]
    assert build.suggestion is not None and build.suggestion.decorator is not None
    assert build.suggestion.decorator in text
    assert "Suggestions" in text
    # Covered functions name the outer call that contains them, and get no suggestion.
    index_row = next(r for r in rows if r.split()[1].endswith("Builder.index"))
    assert index_row.rstrip().endswith("Builder.build")
    assert f"{MOD}:Builder.index\n" not in text.split("Suggestions")[1]
    short = report.table(top=1)
    assert "more (report.table() shows all)" in short
    assert str(report) == report.table(top=15)
    assert "more (report.table() shows all)" in report.table(top=0)
    with pytest.raises(ValueError, match="top must be at least 0"):
        report.table(top=-1)


def test_json_round_trip(report: ProfileReport) -> None:
    data = json.loads(report.to_json())
    assert data["calls"] == report.calls and data["steps"] == report.steps
    assert data["overhead_ns"] == report.overhead_ns
    names = [f["name"] for f in data["functions"]]
    assert names == [f.name for f in report.functions]
    layer = data["functions"][names.index(f"{MOD}:Builder.layer")]
    assert layer["suggestion"]["key"] == ["kind"]
    assert layer["suggestion"]["bypass"] == ["kind", ["wide"]]
    assert layer["calls_per_step"] == 4.0
    assert layer["uncovered_ns"] == layer["redundant_ns"] - layer["covered_ns"]


def test_empty_report() -> None:
    with stepcache.profile(f"{MOD}:total") as report:
        pass
    assert len(report) == 0
    assert "no wrapped function was called" in report.table()
    assert json.loads(report.to_json())["functions"] == []


def work(i: int) -> int:
    return i


def run_step() -> None:
    work(1), work(1)


def test_the_calls_are_those_of_the_profiled_functions() -> None:
    """A step= function that is not a target marks steps; its calls are not counted."""
    with stepcache.profile(f"{__name__}:work", step=f"{__name__}:run_step") as report:
        for _ in range(3):
            run_step()
    assert (report.steps, report.calls, report["work"].calls) == (3, 6, 6)
    assert report.table().startswith("stepcache profile: 3 step(s), 6 call(s) of 1 ")
    assert json.loads(report.to_json())["calls"] == 6
