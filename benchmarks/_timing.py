# SPDX-License-Identifier: Apache-2.0
"""Shared timing helpers for the benchmarks: environment banner and repeated timings."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import timeit
from typing import Any

import attrs


@attrs.frozen
class Timing:
    """Nanoseconds per call over ``repeats`` runs of ``number`` calls each."""

    label: str
    median_ns: float
    min_ns: float
    max_ns: float

    def ratio_to(self, other: Timing) -> float:
        return self.median_ns / other.median_ns


def environment() -> str:
    import numpy
    import torch

    return (
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"torch {torch.__version__}, numpy {numpy.__version__}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.system()}"
    )


def time_stmt(
    label: str,
    stmt: str,
    namespace: dict[str, Any],
    *,
    number: int = 200_000,
    repeats: int = 15,
) -> Timing:
    """Time the statement ``stmt`` (run in ``namespace``) in a tight loop.

    The statement runs as written at a call site (``m.index(buf)``), with no lambda
    around it; the cost of the empty loop is subtracted.
    """
    exec(stmt, namespace)  # warm: the first call is a miss
    empty = min(timeit.repeat("pass", number=number, repeat=5))
    runs = [
        (t - empty) / number * 1e9
        for t in timeit.repeat(stmt, globals=namespace, number=number, repeat=repeats)
    ]
    return Timing(label, statistics.median(runs), min(runs), max(runs))


def _nothing() -> None:
    return None


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
