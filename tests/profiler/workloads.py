# SPDX-License-Identifier: Apache-2.0
"""Workloads to profile: the DSv4 simulation without stepcache decorators.

Run one from a clone's root::

    python -m stepcache profile tests.profiler.workloads:dsv4_uncached \\
        -t stepcache.integrations.dsv4.sim -t stepcache.integrations.dsv4.request_index \\
        --step stepcache.integrations.dsv4.sim:run_step
"""

from __future__ import annotations

from typing import Final

from stepcache.integrations.dsv4 import sim as dsv4_sim

#: a few steps of a serving run: decodes, a prefill chunk, a mixed batch
BATCHES: Final[tuple[tuple[int, ...], ...]] = (
    (1, 1, 1, 1),
    (5, 1, 0, 3),
    (1, 1, 1, 1, 1, 1),
    (7, 2),
)


def dsv4(variant: dsv4_sim.Variant, steps: int = 8, max_tokens: int = 64) -> None:
    """``steps`` DSv4 steps (three builders, ten layers each) in ``variant``."""
    builders = dsv4_sim.Builders(max_tokens=max_tokens)
    for i in range(steps):
        lens = BATCHES[i % len(BATCHES)]
        meta = dsv4_sim.make_step(lens, pad_to=sum(lens) + 2)
        dsv4_sim.run_step(meta, builders, variant)


def dsv4_uncached() -> None:
    """Eight steps of the uncached variant (what vLLM did before the seed PRs)."""
    dsv4("uncached")


def dsv4_stepcache() -> None:
    """Eight steps of the stepcache variant."""
    dsv4("stepcache")
