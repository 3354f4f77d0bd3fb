# SPDX-License-Identifier: Apache-2.0
"""Markdown tables and goal checks shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

__all__ = ["Goal", "GoalResult", "goals_table", "markdown_table"]


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None
) -> str:
    """A Markdown table; ``align`` has one letter per column: ``l``, ``r`` or ``c``.

    >>> print(markdown_table(["a", "b"], [["x", "1"]], "lr"))
    | a | b |
    | --- | ---: |
    | x | 1 |
    """
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    spec = align or "l" * len(header)
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(marks[a] for a in spec) + " |",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@attrs.frozen
class Goal:
    """``measured / baseline <= limit``, on medians; ``source`` says who set it."""

    measured: str
    baseline: str
    limit: float
    source: str

    def check(self, ratio: float) -> GoalResult:
        return GoalResult(self, ratio, ratio <= self.limit)


@attrs.frozen
class GoalResult:
    goal: Goal
    ratio: float
    met: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "measured": self.goal.measured,
            "baseline": self.goal.baseline,
            "limit": self.goal.limit,
            "source": self.goal.source,
            "ratio": self.ratio,
            "met": self.met,
        }


def goals_table(results: Sequence[GoalResult]) -> str:
    """The goals as a Markdown table: ratio of medians, limit, met or not."""
    rows = [
        [
            f"{r.goal.measured} / {r.goal.baseline}",
            f"{r.ratio:.2f}x",
            f"<= {r.goal.limit:g}x",
            "yes" if r.met else "**no**",
            r.goal.source,
        ]
        for r in results
    ]
    return markdown_table(
        ["goal (ratio of medians)", "measured", "limit", "met", "set by"], rows, "lrrcl"
    )
