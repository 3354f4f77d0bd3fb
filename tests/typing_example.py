# SPDX-License-Identifier: Apache-2.0
"""Checked by ``mypy --strict`` in the test command: the decorator keeps signatures."""

from __future__ import annotations

import dataclasses
from typing import assert_type

import torch

import stepcache
from stepcache import BYPASS, Arg, Attr, TensorSpec, step_cached


@dataclasses.dataclass
class Meta:
    query_start_loc: torch.Tensor
    num_actual_tokens: int

    @step_cached(
        ignore=("buffer",),
        depends_on=("query_start_loc", "num_actual_tokens"),
        expect=TensorSpec(
            device=Arg("buffer"),
            dtype=torch.int32,
            min_shape=(Attr("num_actual_tokens"),),
        ),
    )
    def index(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer[: self.num_actual_tokens]


@step_cached(
    key=lambda md, kind, rows: BYPASS if kind == "c4a" else (kind, rows), owner="md"
)
def sparse(md: Meta, kind: str, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(rows), torch.zeros(rows)


def use() -> None:
    m = Meta(torch.tensor([0, 2]), 2)
    assert_type(m.index(torch.zeros(4, dtype=torch.int32)), torch.Tensor)
    assert_type(sparse(m, "swa_only", 3), tuple[torch.Tensor, torch.Tensor])
    table: stepcache.StatsTable = stepcache.stats()
    assert_type(table["Meta.index"].hits, int)
    with stepcache.disabled(), stepcache.debug("checks"):
        m.index(torch.zeros(4, dtype=torch.int32))
