# SPDX-License-Identifier: Apache-2.0
"""Memory soak: 100,000 DSv4 steps with stepcache; resident memory and live entries.

Run: ``python -m benchmarks.bench_soak [--quick] [--steps N]`` (``run_all`` runs it).
Every step builds fresh metadata for a random decode batch of the engine-free DSv4
step, asks for the request index from the three consumers and for the sparse indices
of four layers (SWA-only, two C128A, one C4A: a miss, a hit and a bypass), then drops
the metadata. The sparse indices are zero tensors: the soak measures what the caches
keep. The cycle collector is off: what is freed is freed by reference counting.
Goals (issue 5): RSS growth <= 1 MiB, no live entry once a step's owners are gone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from typing import Any

import torch

import stepcache
from demo import demo
from stepcache._store import live_caches
from stepcache.integrations.dsv4 import request_index, sparse_index
from stepcache.integrations.dsv4 import sim as dsv4_sim

SOAK_LAYERS = ("swa_only", "c128a", "c128a", "c4a")
MAX_GROWTH_BYTES = 1 << 20
SEGMENTS = 10


def rss_bytes() -> int:
    """Resident memory of this process now (Linux; elsewhere the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


#: The stats rows of the two cached functions the soak calls.
SOAK_FUNCTIONS = ("dsv4.token_to_req_indices", "dsv4.sparse_index")


def live_entries(before: frozenset[int] = frozenset()) -> int:
    """Entries of the soak's cached functions held by the live step caches, but for
    the stores whose ids are in ``before`` (alive when the soak started, and kept alive
    by it: another benchmark's or test's, whose entries are not the soak's)."""
    return sum(
        row["entries"]
        for store in live_caches()
        if id(store) not in before
        for name, row in store.stats().items()
        if name in SOAK_FUNCTIONS
    )


def _sparse_pair(rows: int) -> sparse_index.SparseIndexPair:
    return (
        torch.zeros((rows, 12), dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
    )


def _step(
    builders: dsv4_sim.Builders, rng: random.Random, before: frozenset[int]
) -> tuple[int, int]:
    """One step; returns the live entries while its metadata is alive and after."""
    lens = [1] * rng.randint(1, 64)
    meta = dsv4_sim.make_step(lens, pad_to=demo.graph_size(len(lens)))
    rows = meta.num_actual_tokens
    request_index.token_to_req_indices(meta, builders.sparse_mla_buffer)
    request_index.token_to_req_indices(meta, builders.compressor_buffer)
    swa = builders.build_swa(meta, "stepcache")  # the third consumer
    for kind in SOAK_LAYERS:
        sparse_index.sparse_index(swa, kind, None, lambda: _sparse_pair(rows))
    during = live_entries(before)
    del meta, swa
    return during, live_entries(before)


def soak(steps: int = 100_000, warmup: int = 1_000, seed: int = 0) -> dict[str, Any]:
    """``warmup`` steps, then ``steps`` more: RSS before and after, RSS growth and
    time per step of each tenth, the live entries during and after every step."""
    rng = random.Random(seed)
    builders = dsv4_sim.Builders(max_tokens=64)
    segment = max(steps // SEGMENTS, 1)
    gc.collect()
    stepcache.reset_stats()
    # the stores alive now are not the soak's: held here, so that no id is reused
    existing = live_caches()
    before = frozenset(id(store) for store in existing)
    rss_start = rss_bytes()
    gc.disable()  # what is freed is freed by reference counting
    try:
        for _ in range(warmup):
            _step(builders, rng, before)
        rss_before = rss = rss_bytes()
        max_during = max_after = with_live = 0
        seg_ns: list[float] = []
        seg_growth: list[int] = []
        seg_start, done = time.perf_counter_ns(), 0
        for i in range(1, steps + 1):
            during, after = _step(builders, rng, before)
            max_during, max_after = max(max_during, during), max(max_after, after)
            with_live += after > 0
            if i % segment == 0 or i == steps:
                seg_ns.append((time.perf_counter_ns() - seg_start) / (i - done))
                seg_growth.append(rss_bytes() - rss)
                rss, done, seg_start = rss_bytes(), i, time.perf_counter_ns()
                print(
                    f"bench_soak: {i:>7}/{steps} steps, RSS {rss / 2**20:.1f} MiB, "
                    f"live entries after the last step: {after}",
                    file=sys.stderr,
                )
        rss_after = rss_bytes()
    finally:
        garbage = gc.collect()
        gc.enable()
    return {
        "steps": steps,
        "warmup": warmup,
        "rss_start_bytes": rss_start,
        "rss_before_bytes": rss_before,
        "rss_after_bytes": rss_after,
        "growth_bytes": rss_after - rss_before,
        "growth_limit_bytes": MAX_GROWTH_BYTES,
        "segment_growth_bytes": seg_growth,
        "max_live_entries_during_step": max_during,
        "max_live_entries_after_step": max_after,
        "steps_with_live_entries_after": with_live,
        "us_per_step_per_tenth": [round(ns / 1e3, 1) for ns in seg_ns],
        "median_us_per_step": round(statistics.median(seg_ns) / 1e3, 1),
        "cycle_garbage_objects": garbage,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="2,000 steps")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    steps, warmup = (2_000, 200) if args.quick else (args.steps, 1_000)
    print(json.dumps(soak(steps, warmup), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
