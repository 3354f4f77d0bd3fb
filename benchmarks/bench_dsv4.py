# SPDX-License-Identifier: Apache-2.0
"""The metadata build of one DSv4 step: uncached, the seeds' hand-written caches, stepcache.

Run: ``python -m benchmarks.bench_dsv4 [--fast] [--rows TEXT] [--results PATH]`` (and
any other pyperf option). The engine-free step of
:mod:`stepcache.integrations.dsv4.sim`: the sparse-MLA, compressor and sparse-SWA
builders each ask for the request index, then every layer for its sparse indices (two
SWA-only layers, then C4A and C128A alternating; C4A layers are never cached). The
batch is decode-heavy: up to 256 one-token decodes, the rest in prefill chunks of at
most 1024 tokens. pyperf times each (point, variant) in worker processes of its own:
a value is ``loops`` steps, each on a fresh metadata object made before the timer
starts, all with the same builders and persistent buffers, the cycle collector paused.
Before the timing, every point checks that the three variants give the same values.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import _pyperf
from benchmarks._pyperf import Prepare, Row, TimeFunc
from demo import demo
from stepcache.integrations.dsv4 import sim as dsv4_sim

MODULE = "benchmarks.bench_dsv4"
RESULTS = _pyperf.ROOT / "build" / "benchmarks" / "dsv4.json"
#: (layers, tokens) of each point
POINTS = ((8, 1), (8, 256), (8, 4096), (61, 1), (61, 256), (61, 4096))
LABELS: dict[str, str] = {
    "uncached": "uncached",
    "handwritten": "hand-written",
    "stepcache": "stepcache",
}


def batch_layout(tokens: int) -> list[int]:
    """Query lengths of a batch of ``tokens`` tokens: up to 256 one-token decodes,
    the rest in prefill chunks of at most 1024 tokens.

    >>> batch_layout(3), batch_layout(300)
    ([1, 1, 1], [1, 1, ...])
    """
    lens = [1] * min(tokens, 256)
    rest = tokens - len(lens)
    while rest > 0:
        lens.append(min(rest, 1024))
        rest -= lens[-1]
    return lens


def name(layers: int, tokens: int, variant: dsv4_sim.Variant) -> str:
    return f"{layers} layers, {tokens} tokens/{LABELS[variant]}"


def _step(layers: int, tokens: int, variant: dsv4_sim.Variant) -> Prepare:
    def prepare() -> TimeFunc:
        kinds = demo.layer_kinds(layers)
        lens = batch_layout(tokens)
        builders = dsv4_sim.Builders(max_tokens=tokens)
        dsv4_sim.build_step(dsv4_sim.make_step(lens), builders, variant, kinds)

        def time_func(loops: int) -> float:
            metas = [dsv4_sim.make_step(lens) for _ in range(loops)]
            gc.disable()  # a collection would land on whichever step runs then
            try:
                start = time.perf_counter()
                for meta in metas:
                    dsv4_sim.build_step(meta, builders, variant, kinds)
                return time.perf_counter() - start
            finally:
                gc.enable()

        return time_func

    return prepare


def work_per_step() -> dict[str, Any]:
    """Request-index computations and sparse-index builds per step of each variant at
    each point; raises where a variant's values differ from the uncached ones."""
    out: dict[str, dict[str, list[int]]] = {}
    for layers, tokens in POINTS:
        kinds = demo.layer_kinds(layers)
        lens = batch_layout(tokens)
        builders = dsv4_sim.Builders(max_tokens=tokens)
        runs = {
            v: dsv4_sim.run_step(dsv4_sim.make_step(lens), builders, v, kinds)
            for v in dsv4_sim.VARIANTS
        }
        for v, run in runs.items():
            if not demo.same_result(run, runs["uncached"]):
                raise AssertionError(f"{v} differs from uncached at {layers}x{tokens}")
        out[f"{layers} layers, {tokens} tokens"] = {
            LABELS[v]: [run.index_computations, run.sparse_builds]
            for v, run in runs.items()
        }
    return {"work_per_step": out}


BENCHES: dict[str, Prepare] = {
    name(layers, tokens, v): _step(layers, tokens, v)
    for layers, tokens in POINTS
    for v in dsv4_sim.VARIANTS
}
_STEP = "DSv4 step's metadata build ({} layers, {} tokens)"
ROWS = [
    row
    for layers, tokens in POINTS
    for row in (
        Row(
            f"{layers}x{tokens}",
            _STEP.format(layers, tokens)
            + ": stepcache (its request index and decorated sparse-index builder) / "
            "the seeds' hand-written caches (a slot and a dict, checked inline)",
            name(layers, tokens, "stepcache"),
            name(layers, tokens, "handwritten"),
            1.05,
            "issue 5",
        ),
        Row(
            f"{layers}x{tokens} uncached",
            _STEP.format(layers, tokens) + ": uncached / stepcache",
            name(layers, tokens, "uncached"),
            name(layers, tokens, "stepcache"),
        ),
    )
]


def main(argv: Sequence[str] | None = None) -> int:
    return _pyperf.main(
        MODULE,
        BENCHES,
        ROWS,
        processes=3,
        values=3,
        results=RESULTS,
        argv=argv,
        extra=work_per_step,
    )


if __name__ == "__main__":
    sys.exit(main())
