# SPDX-License-Identifier: Apache-2.0
"""A step-cached call inside ``torch.compile`` (dynamo traces the hit and the miss):
the values of eager mode, and `stats()` still readable."""

from __future__ import annotations

import torch

import stepcache
from stepcache import step_cached


class Meta:
    def __init__(self, qsl: torch.Tensor) -> None:
        self.qsl = qsl

    @step_cached(depends_on=("qsl",), name="compile.lens")
    def lens(self) -> torch.Tensor:
        return self.qsl.diff()


def use(md: Meta, x: torch.Tensor) -> torch.Tensor:
    return x * md.lens().sum()


def test_compiled_calls_give_eager_values_and_stats_stay_readable() -> None:
    compiled = torch.compile(use, backend="eager")
    md, x = Meta(torch.tensor([0, 2, 5])), torch.ones(2)
    changes = [None, "in place", "reassigned", "new owner"]
    if torch.is_inference_mode_enabled():  # such a write is not seen (docs/limits.md)
        changes.remove("in place")
    for change in changes:
        if change == "in place":
            md.qsl.add_(torch.tensor([0, 0, 1]))
        elif change == "reassigned":
            md.qsl = torch.tensor([0, 1, 7])
        elif change == "new owner":
            md = Meta(torch.tensor([0, 4]))
        assert compiled(md, x).tolist() == (x * md.qsl.diff().sum()).tolist()
    row = stepcache.stats()["compile.lens"]  # tracing made a store it then dropped
    assert row.misses >= len(changes)
