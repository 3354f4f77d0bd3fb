# SPDX-License-Identifier: Apache-2.0
"""Where a DSv4 step's time goes, stage by stage: hand-written vs stepcache.

Run: ``python -m benchmarks.bench_stages [--layers N] [--tokens N] [--rounds N]``.
Each round builds one step with each variant (in alternating order, each on fresh
metadata, the cycle collector paused) and times every stage on its own: the three
builders (sparse MLA, compressor, sparse SWA), then each layer's sparse-index lookup.
Each row is the median over the rounds. The stages where the two differ are where
stepcache's bookkeeping runs: the first request-index call (a miss), the first
lookup of each cached layer kind (a miss), the C4A layers (a bypass) and the hits.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import attrs
import torch

from benchmarks._report import markdown_table
from benchmarks._timing import collector_paused, environment, progress
from benchmarks.bench_dsv4 import batch_layout
from demo import demo
from stepcache.integrations.dsv4 import sim as dsv4_sim
from stepcache.integrations.dsv4 import sparse_index

VARIANTS: tuple[dsv4_sim.Variant, ...] = ("handwritten", "stepcache")
#: timed rounds (a step of each variant)
ROUNDS = 401


@attrs.frozen
class StageResults:
    layers: int
    tokens: int
    rounds: int
    #: stage label -> (hand-written median ns, stepcache median ns)
    stages: dict[str, tuple[float, float]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": self.layers,
            "tokens": self.tokens,
            "rounds": self.rounds,
            "median_ns": {
                k: {"hand-written": h, "stepcache": s}
                for k, (h, s) in self.stages.items()
            },
        }


def _one_step(
    builders: dsv4_sim.Builders,
    meta: dsv4_sim.StepMetadata,
    variant: dsv4_sim.Variant,
    kinds: tuple[str, ...],
    into: dict[str, list[int]],
) -> None:
    clock = time.perf_counter_ns
    t0 = clock()
    builders.build_sparse_mla(meta, variant)
    t1 = clock()
    builders.build_compressor(meta, variant)
    t2 = clock()
    swa = builders.build_swa(meta, variant)
    t3 = clock()
    into["sparse-MLA builder (request index)"].append(t1 - t0)
    into["compressor builder (request index)"].append(t2 - t1)
    into["sparse-SWA builder (request index)"].append(t3 - t2)
    for i, kind in enumerate(kinds):
        start = clock()
        builders.layer_sparse_index(swa, kind, i, variant)
        into[f"layer {i} ({kind})"].append(clock() - start)


def run(layers: int = 8, tokens: int = 4, rounds: int = ROUNDS) -> StageResults:
    kinds = tuple(demo.layer_kinds(layers))
    lens = batch_layout(tokens)
    # one set of builders (the same persistent buffers) for both variants, as in
    # bench_dsv4: the buffers' placement alone moves a build by several percent
    shared = dsv4_sim.Builders(max_tokens=max(tokens, 1))
    builders = {v: shared for v in VARIANTS}
    labels = [
        "sparse-MLA builder (request index)",
        "compressor builder (request index)",
        "sparse-SWA builder (request index)",
    ] + [f"layer {i} ({kind})" for i, kind in enumerate(kinds)]
    samples: dict[str, dict[str, list[int]]] = {
        v: {label: [] for label in labels} for v in VARIANTS
    }
    for v in VARIANTS:  # warm up
        for _ in range(5):
            _one_step(builders[v], dsv4_sim.make_step(lens), v, kinds, samples[v])
        samples[v] = {label: [] for label in labels}
    with collector_paused() as between_rounds:
        for r in range(rounds):
            order = VARIANTS if r % 2 else VARIANTS[::-1]
            metas = {v: dsv4_sim.make_step(lens) for v in order}
            for v in order:
                _one_step(builders[v], metas[v], v, kinds, samples[v])
            del metas
            between_rounds(r)
    stages = {
        label: (
            statistics.median(samples["handwritten"][label]),
            statistics.median(samples["stepcache"][label]),
        )
        for label in labels
    }
    return StageResults(layers, tokens, rounds, stages)


def stage_groups(results: StageResults) -> dict[str, tuple[int, float]]:
    """What stepcache does at each stage, and the stages' summed difference (ns):
    ``{"misses": (count, ns), "hits": ..., "bypasses": ...}``.

    The first builder misses the request index and the other two hit it; the first
    layer of each cached kind misses, its later layers hit, and C4A layers bypass.

    >>> r = StageResults(2, 4, 1, {
    ...     "sparse-MLA builder (request index)": (10.0, 14.0),
    ...     "compressor builder (request index)": (5.0, 4.0),
    ...     "layer 0 (swa_only)": (8.0, 9.0),
    ...     "layer 1 (swa_only)": (1.0, 2.0),
    ...     "layer 2 (c4a)": (7.0, 7.5)})
    >>> stage_groups(r)
    {'misses': (2, 5.0), 'hits': (2, 0.0), 'bypasses': (1, 0.5)}
    """
    groups = {"misses": [0, 0.0], "hits": [0, 0.0], "bypasses": [0, 0.0]}
    seen: set[str] = set()  # the cached things asked for so far
    for label, (hand, cached) in results.stages.items():
        # a builder's stage asks for the request index, a layer's for its kind
        what = label.rpartition("(")[2].rstrip(")")
        if what != "request index" and what not in sparse_index.CACHED_KINDS:
            group = "bypasses"
        else:
            group = "hits" if what in seen else "misses"
            seen.add(what)
        groups[group][0] += 1
        groups[group][1] += cached - hand
    return {k: (int(n), float(ns)) for k, (n, ns) in groups.items()}


def render(results: StageResults) -> str:
    rows = []
    total_h = total_s = 0.0
    for label, (h, s) in results.stages.items():
        total_h += h
        total_s += s
        rows.append(
            [label, f"{h / 1e3:.1f}", f"{s / 1e3:.1f}", f"{(s - h) / 1e3:+.1f}"]
        )
    rows.append(
        [
            "**sum of the medians**",
            f"{total_h / 1e3:.1f}",
            f"{total_s / 1e3:.1f}",
            f"{(total_s - total_h) / 1e3:+.1f}",
        ]
    )
    return markdown_table(
        ["stage", "hand-written us", "stepcache us", "difference us"], rows, "lrrr"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"Environment: {environment()}")
    progress(f"bench_stages: {args.layers} layers, {args.tokens} tokens ...")
    print(render(run(args.layers, args.tokens, args.rounds)))


if __name__ == "__main__":
    main()
