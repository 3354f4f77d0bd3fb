# SPDX-License-Identifier: Apache-2.0
"""A small engine-free metadata module for the profiler's tests: a step object, a
builder with persistent buffers, layers, free functions, and names it imports."""

from __future__ import annotations

import dataclasses
from math import sqrt  # noqa: F401  (imported: not a target of this module)

import torch

CONSTANT = 3
calls = {"lens": 0, "layer": 0}


@dataclasses.dataclass
class Step:
    """One step's layout."""

    query_lens: torch.Tensor
    num_tokens: int
    note: str = ""


def make_step(lens: list[int]) -> Step:
    return Step(torch.tensor(lens), sum(lens))


def total(query_lens: torch.Tensor) -> int:
    return int(query_lens.sum())


def scaled(query_lens: torch.Tensor, factor: int = 1, *, offset: int = 0) -> int:
    return int(query_lens.sum()) * factor + offset


def noisy(step: Step) -> int:
    calls["lens"] += 1
    return calls["lens"]  # reads a counter its arguments do not show


class Builder:
    """Builds per-step metadata into its own persistent buffer."""

    def __init__(self) -> None:
        self.buffer = torch.zeros(64, dtype=torch.int64)
        self.builds = 0

    def build(self, step: Step) -> torch.Tensor:
        self.builds += 1
        return self.index(step, self.buffer)

    def index(self, step: Step, out: torch.Tensor) -> torch.Tensor:
        lens = step.query_lens
        n = step.num_tokens
        out[:n] = torch.repeat_interleave(torch.arange(lens.numel()), lens)
        return out[:n]

    def layer(self, step: Step, kind: str, number: int) -> torch.Tensor:
        calls["layer"] += 1
        width = number + 1 if kind == "wide" else 2
        return torch.arange(step.num_tokens * width).reshape(step.num_tokens, width)

    @staticmethod
    def helper(x: int) -> int:
        return x + 1

    @classmethod
    def make(cls) -> Builder:
        return cls()

    @property
    def size(self) -> int:
        return int(self.buffer.numel())

    def __repr__(self) -> str:
        return "Builder()"


def run(
    steps: list[list[int]],
    kinds: tuple[str, ...] = ("narrow", "narrow", "wide", "wide"),
) -> None:
    """Steps of two builders, then one layer call per kind."""
    first, second = Builder(), Builder()
    for lens in steps:
        step = make_step(lens)
        first.build(step)
        second.build(step)
        for number, kind in enumerate(kinds):
            first.layer(step, kind, number)
