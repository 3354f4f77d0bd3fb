# SPDX-License-Identifier: Apache-2.0
"""The calls kept for the analysis are bounded: each function gets its own share, and
a function that lost calls to the bound says so."""

from __future__ import annotations

import json

import pytest

import stepcache
from stepcache.profiler import ProfileReport, _recorder


class Meta:
    pass


def busy(meta: Meta, i: int) -> int:
    return i


def late(meta: Meta) -> int:
    return 42


def run(steps: int) -> ProfileReport:
    with stepcache.profile([f"{__name__}:busy", f"{__name__}:late"]) as report:
        for s in range(steps):
            meta = Meta()
            for i in range(10):
                busy(meta, i)
            if s >= steps - 2:  # only at the end, once busy has used its share
                late(meta), late(meta), late(meta)
            report.step()
    return report


def test_each_function_has_its_own_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_recorder, "MAX_KEPT_PER_FUNCTION", 25)
    report = run(5)
    busy_row, late_row = report["busy"], report["late"]
    assert (busy_row.calls, busy_row.dropped) == (50, 25)
    assert any("only the first 25 calls were analysed" in n for n in busy_row.notes)
    assert (late_row.calls, late_row.dropped, late_row.redundant) == (6, 0, 4)
    assert late_row.suggestion is not None and late_row.suggestion.owner == "meta"
    assert f"{__name__}:busy *" in report.table()
    rows = json.loads(report.to_json())["functions"]
    assert {r["name"].rpartition(":")[2]: r["dropped"] for r in rows} == {
        "busy": 25,
        "late": 0,
    }


def test_the_total_bound_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_recorder, "MAX_KEPT_CALLS", 30)
    report = run(5)
    assert (report["busy"].dropped, report["late"].dropped) == (20, 6)
    assert report["late"].redundant == 0  # nothing analysed, and the row says so
    assert any("budget" in n for n in report["late"].notes)
