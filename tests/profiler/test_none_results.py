# SPDX-License-Identifier: Apache-2.0
"""A function that returns None is never "redundant" by its results: None says nothing
of what it did (it may write into an argument). Identical arguments still count."""

from __future__ import annotations

import torch

import stepcache
from stepcache.profiler import ProfileReport


class Meta:
    pass


def fill(meta: Meta, buffer: torch.Tensor, value: int) -> None:
    buffer.fill_(value)  # its work is the write; the result is always None


LOG: list[int] = []


def log(meta: Meta, value: int) -> None:
    LOG.append(value)  # its work is outside its arguments


def maybe(meta: Meta, value: int) -> int | None:
    return value if value > 0 else None


def run(name: str, values: tuple[int, ...]) -> ProfileReport:
    with stepcache.profile(f"{__name__}:{name}") as report:
        for _ in range(2):
            meta, buffer = Meta(), torch.zeros(2)
            for v in values:
                if name == "fill":
                    fill(meta, buffer, v)
                else:
                    globals()[name](meta, v)
            report.step()
    return report


def test_calls_that_return_none_with_different_arguments_are_not_redundant() -> None:
    for name in ("fill", "log"):
        row = run(name, (1, 2, 3))[name]
        assert (row.calls, row.identical, row.redundant) == (6, 0, 0), name
        assert row.suggestion is None


def test_calls_with_identical_arguments_still_count() -> None:
    report = run("log", (1, 1, 2))
    row = report["log"]
    assert (row.identical, row.redundant) == (2, 2)
    s = row.suggestion
    assert s is not None and s.owner == "meta" and s.key == ("value",)
    assert s.notes[0].startswith("6 call(s) returned None, which is not compared")
    text = report.table()
    assert "(identical arguments)" in text and "equal results" not in text


def test_none_beside_other_results_is_no_evidence_either() -> None:
    # maybe(meta, -1) and maybe(meta, -2) both return None: not equal results, so
    # 'value' stays in the key; maybe(meta, 5) twice is a repeat
    row = run("maybe", (-1, -2, 5, 5))["maybe"]
    assert (row.identical, row.redundant, row.impure) == (2, 2, 0)
    assert row.suggestion is not None and row.suggestion.key == ("value",)
