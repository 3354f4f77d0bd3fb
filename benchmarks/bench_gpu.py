# SPDX-License-Identifier: Apache-2.0
"""GPU numbers: copies, synchronisations, kernel launches and time per step.

Run on a machine with one CUDA GPU: ``python scripts/gpu_bench.py [--quick]``; without
CUDA it says so and exits 0. With CUDA tensors and buffers it runs the request index
per step of :mod:`benchmarks.bench_cold` and the DSv4 step of
:mod:`benchmarks.bench_dsv4` at several sizes, each variant, and counts per step the
copies into the request-index buffers and all copies (a ``TorchDispatchMode``), the
synchronising calls (``torch.cuda.set_sync_debug_mode``) and the kernels
(``torch.profiler``); a time is ``steps`` steps ended by ``torch.cuda.synchronize()``,
median over ``repeats`` runs, the variants interleaved. It writes
``docs/benchmarks/gpu.json`` with the date, the GPU, the commit and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks import bench_cold
from benchmarks._pyperf import machine, source_state
from benchmarks.bench_cold import CopyCounter
from benchmarks.bench_dsv4 import LABELS, batch_layout
from demo import demo
from stepcache.integrations.dsv4 import sim as dsv4_sim

TOKENS: tuple[int, ...] = (1, 64, 512, 4096)
LAYERS: tuple[int, ...] = (8, 30, 61)
#: stop starting new points after this many seconds (the whole run must stay < 8 min)
BUDGET_S = 360.0


def _profile(fn: Callable[[], object]) -> tuple[int, int, int]:
    """Kernel launches (host runtime calls), device kernels and device memcpys that
    ``fn()`` issues, from torch.profiler (the device counts need CUPTI)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = kernels = memcpys = 0
    for evt in prof.events():
        if getattr(evt, "device_type", None) == DeviceType.CUDA:
            memcpys += evt.name.startswith("Memcpy")
            kernels += not evt.name.startswith(("Memcpy", "Memset"))
        else:  # cudaLaunchKernel, cuLaunchKernel, ...
            launches += "LaunchKernel" in evt.name
    return launches, kernels, memcpys


def count_syncs(fn: Callable[[], object]) -> int:
    """How many synchronising CUDA calls ``fn()`` makes: the warnings of
    ``torch.cuda.set_sync_debug_mode("warn")``, caught and counted."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(w.message) for w in caught)


def measure(
    what: str,
    make: dict[str, Callable[[], Any]],
    run: dict[str, Callable[[Any], object]],
    buffers: dict[str, list[torch.Tensor]],
    steps: int,
    repeats: int,
) -> list[dict[str, Any]]:
    """Per variant: the counts of one step ``run[v](make[v]())`` (its input made
    first: its own copies are not the step's), then its time per step."""
    out = {}
    for v in make:
        for _ in range(2):  # warm up: allocator, pinned memory, kernels
            run[v](make[v]())
        torch.cuda.synchronize()
        first, second = make[v](), make[v]()
        with CopyCounter(buffers[v]) as c:
            syncs = count_syncs(lambda: run[v](first))  # noqa: B023
        launches, kernels, memcpys = _profile(lambda: run[v](second))  # noqa: B023
        out[v] = {
            "what": what,
            "variant": LABELS.get(v, v),
            "h2d_copies_into_index_buffers": c.h2d_into_targets,
            "h2d_copies": c.h2d,
            "d2h_copies": c.d2h,
            "d2h_scalar_reads": c.scalar_reads,
            "synchronisations": syncs,
            "kernel_launches": launches,
            "cuda_kernels": kernels,
            "cuda_memcpys": memcpys,
        }
    times: dict[str, list[float]] = {v: [] for v in make}
    order = list(make)
    for r in range(repeats):
        for v in order[r % 3 :] + order[: r % 3]:  # no variant always first
            inputs = [make[v]() for _ in range(steps)]
            torch.cuda.synchronize()
            start = time.perf_counter_ns()
            for x in inputs:
                run[v](x)
            torch.cuda.synchronize()
            times[v].append((time.perf_counter_ns() - start) / steps)
    for v, ns in times.items():
        out[v]["ns_per_step"] = {
            "median_ns": statistics.median(ns),
            "min_ns": min(ns),
            "max_ns": max(ns),
        }
    return list(out.values())


def _constant(x: Any) -> Callable[[], Any]:
    return lambda: x


def request_index(device: torch.device, steps: int, repeats: int) -> list[Any]:
    """bench_cold's request index per step on ``device``, each shape and variant."""
    rows = []
    for shape, step in bench_cold.SHAPES.items():
        layouts = {v: bench_cold.Layout(device) for v in bench_cold.VARIANTS}
        rows += measure(
            f"request index, {shape}",
            {v: _constant(x) for v, x in layouts.items()},
            {v: step(v) for v in layouts},
            {v: layouts[v].buffers for v in layouts},
            steps,
            repeats,
        )
    return rows


def dsv4_step(
    tokens: int, layers: int, device: torch.device, steps: int, repeats: int
) -> list[Any]:
    """bench_dsv4's step at one point on ``device``, each variant."""
    kinds, lens = demo.layer_kinds(layers), batch_layout(tokens)
    builders = {
        v: dsv4_sim.Builders(max_tokens=tokens, device=device)
        for v in dsv4_sim.VARIANTS
    }
    return measure(
        f"DSv4 step, {layers} layers, {tokens} tokens",
        {v: lambda: dsv4_sim.make_step(lens, device=device) for v in builders},
        {
            v: lambda meta, v=v: dsv4_sim.build_step(meta, builders[v], v, kinds)  # type: ignore[misc]
            for v in builders
        },
        {
            v: [b.sparse_mla_buffer, b.compressor_buffer, b.swa_buffer]
            for v, b in builders.items()
        },
        steps,
        repeats,
    )


def run(
    tokens: Sequence[int] = TOKENS,
    layers: Sequence[int] = LAYERS,
    steps: int = 10,
    repeats: int = 7,
    budget_s: float = BUDGET_S,
) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    started = time.monotonic()
    print("bench_gpu: the request index per step ...", file=sys.stderr)
    rows = request_index(device, steps=steps * 10, repeats=repeats)
    skipped: list[str] = []
    for n_layers in layers:
        for n_tokens in tokens:
            if time.monotonic() - started > budget_s:
                skipped.append(f"{n_tokens} tokens x {n_layers} layers")
                continue
            print(f"bench_gpu: {n_tokens} tokens, {n_layers} layers", file=sys.stderr)
            rows += dsv4_step(n_tokens, n_layers, device, steps, repeats)
    return {
        "date": f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC",
        "gpu": torch.cuda.get_device_name(device),
        "environment": f"Python {platform.python_version()}, torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}",
        "command": "python scripts/gpu_bench.py",
        "source": source_state(),
        "machine": machine(),
        "steps_per_run": steps,
        "repeats": repeats,
        "rows": rows,
        "skipped_for_time": skipped,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one point, a smoke run")
    parser.add_argument("--steps", type=int, default=10, help="steps per run")
    parser.add_argument("--repeats", type=int, default=7, help="runs per variant")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="docs folder")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured (needs one GPU)")
        return 0
    if args.quick:
        data = run((64,), (8,), steps=2, repeats=2)
    else:
        data = run(steps=args.steps, repeats=args.repeats)
    text = json.dumps(data, indent=1, sort_keys=True)
    print(text)
    if not args.no_write and not args.quick:
        saved = args.out / "benchmarks" / "gpu.json"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(text + "\n")
        print(f"wrote {saved}; python -m benchmarks.page puts it on the page")
    return 0


if __name__ == "__main__":
    sys.exit(main())
