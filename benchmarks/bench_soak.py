# SPDX-License-Identifier: Apache-2.0
"""Memory soak: 100,000 DSv4 steps with stepcache; resident memory and live entries.

Run: ``python -m benchmarks.bench_soak [--quick] [--steps N]``. Every step builds a
fresh metadata object for a random decode batch of the engine-free DSv4 step, asks
for the request index from the three consumers (the builders' persistent buffers, as
an engine keeps them) and for the sparse indices of four layers (SWA-only, two C128A,
one C4A: a miss, a hit and a bypass of the sparse-index cache); then the step's
metadata is dropped. The sparse indices are fresh zero tensors of the right shape: the
soak measures what the caches keep, not the simulation's arithmetic. The cycle collector is off for the whole soak, so
whatever is freed is freed by reference counting alone.

Reported: resident memory (RSS) after a warm-up and at the end, its growth; the live
stepcache entries while a step's metadata is alive and once it is gone, after every
step; the time per step of each tenth of the soak (median, min, max over the tenths).
Goals: growth <= 1 MiB, zero live entries once the step's owners are gone.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from typing import Any

import attrs
import torch

import stepcache
from benchmarks._report import markdown_table
from benchmarks._timing import Timing, environment, progress
from demo import demo
from stepcache._store import live_caches
from stepcache.integrations.dsv4 import request_index, sparse_index
from stepcache.integrations.dsv4 import sim as dsv4_sim

SOAK_LAYERS = ("swa_only", "c128a", "c128a", "c4a")
MAX_GROWTH_BYTES = 1 << 20
SEGMENTS = 10


def rss_bytes() -> int:
    """Resident memory of this process now (Linux ``/proc/self/statm``; elsewhere
    psutil if installed, else the peak from ``resource``)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        return int(psutil.Process().memory_info().rss)
    except ImportError:
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


@attrs.frozen
class SoakResults:
    steps: int
    warmup: int
    rss_start: int
    rss_before: int
    rss_after: int
    #: (step, RSS bytes) samples, for the plot
    rss_samples: list[tuple[int, int]]
    max_live_during: int
    max_live_after: int
    steps_with_live_after: int
    step_time: Timing
    segment_growth: list[int]
    cycle_garbage: int

    @property
    def growth(self) -> int:
        return self.rss_after - self.rss_before

    @property
    def growth_met(self) -> bool:
        return self.growth <= MAX_GROWTH_BYTES

    @property
    def live_met(self) -> bool:
        return self.max_live_after == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "warmup": self.warmup,
            "rss_start_bytes": self.rss_start,
            "rss_before_bytes": self.rss_before,
            "rss_after_bytes": self.rss_after,
            "growth_bytes": self.growth,
            "segment_growth_bytes": self.segment_growth,
            "max_live_entries_during_step": self.max_live_during,
            "max_live_entries_after_step": self.max_live_after,
            "steps_with_live_entries_after": self.steps_with_live_after,
            "ns_per_step": self.step_time.to_dict(),
            "cycle_garbage_objects": self.cycle_garbage,
            "rss_samples": self.rss_samples,
            "goals": {"growth": self.growth_met, "zero_live_after": self.live_met},
        }


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


def soak(steps: int = 100_000, warmup: int = 1_000, seed: int = 0) -> SoakResults:
    rng = random.Random(seed)
    builders = dsv4_sim.Builders(max_tokens=64)
    sample_every = max(steps // 100, 1)
    segment = max(steps // SEGMENTS, 1)
    gc.collect()
    stepcache.reset_stats()
    # the stores alive now are not the soak's: held here, so that no id is reused
    existing = live_caches()
    before = frozenset(id(store) for store in existing)
    rss_start = rss_bytes()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(warmup):
            _step(builders, rng, before)
        rss_before = rss_bytes()
        samples = [(0, rss_before)]
        max_during = max_after = with_live = 0
        seg_ns: list[float] = []
        seg_growth: list[int] = []
        seg_start, seg_rss = time.perf_counter_ns(), rss_before
        for i in range(1, steps + 1):
            during, after = _step(builders, rng, before)
            max_during = max(max_during, during)
            max_after = max(max_after, after)
            with_live += after > 0
            if i % sample_every == 0:
                samples.append((i, rss_bytes()))
            if i % segment == 0 or i == steps:
                now = time.perf_counter_ns()
                done = i - (len(seg_ns) * segment)
                seg_ns.append((now - seg_start) / done)
                rss = rss_bytes()
                seg_growth.append(rss - seg_rss)
                seg_start, seg_rss = time.perf_counter_ns(), rss
                progress(
                    f"bench_soak: {i:>7}/{steps} steps, RSS {rss / 2**20:.1f} MiB, "
                    f"live entries after the last step: {after}"
                )
        rss_after = rss_bytes()
    finally:
        garbage = gc.collect()
        if was_enabled:
            gc.enable()
    return SoakResults(
        steps=steps,
        warmup=warmup,
        rss_start=rss_start,
        rss_before=rss_before,
        rss_after=rss_after,
        rss_samples=samples,
        max_live_during=max_during,
        max_live_after=max_after,
        steps_with_live_after=with_live,
        step_time=Timing.of("ns per step", seg_ns),
        segment_growth=seg_growth,
        cycle_garbage=garbage,
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:+.3f} MiB" if n < 0 or n > 0 else "0 MiB"


def render(r: SoakResults) -> str:
    t = r.step_time
    seg = sorted(r.segment_growth)
    rows = [
        ["steps (after a warm-up of)", f"{r.steps:,} ({r.warmup:,})"],
        [
            "RSS at start / after warm-up / at end",
            f"{r.rss_start / 2**20:.1f} / "
            f"{r.rss_before / 2**20:.1f} / {r.rss_after / 2**20:.1f} MiB",
        ],
        [
            "RSS growth over the soak (goal <= 1 MiB)",
            f"{_mib(r.growth)} ({'met' if r.growth_met else '**not met**'})",
        ],
        [
            "RSS growth per tenth: median (min, max)",
            f"{_mib(seg[len(seg) // 2])} ({_mib(seg[0])}, {_mib(seg[-1])})",
        ],
        ["live entries while a step's metadata is alive (max)", str(r.max_live_during)],
        [
            "live entries once it is gone (max; goal 0)",
            f"{r.max_live_after} ({'met' if r.live_met else '**not met**'})",
        ],
        ["steps that left live entries behind", str(r.steps_with_live_after)],
        [
            "objects left for the cycle collector (gc off during the soak)",
            str(r.cycle_garbage),
        ],
        [
            "time per step per tenth: median (min, max)",
            f"{t.median_ns / 1e3:.0f} us ({t.min_ns / 1e3:.0f}, {t.max_ns / 1e3:.0f})",
        ],
    ]
    return markdown_table(["soak", "measured"], rows, "lr")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"Environment: {environment()}")
    steps, warmup = (2_000, 200) if args.quick else (args.steps, 1_000)
    print(render(soak(steps, warmup)))


if __name__ == "__main__":
    main()
