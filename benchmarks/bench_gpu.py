# SPDX-License-Identifier: Apache-2.0
"""GPU numbers for the DSv4 step: copies, kernel launches and build time per step.

Run on a machine with one CUDA GPU: ``python scripts/gpu_bench.py [--quick]`` (or
``python -m benchmarks.bench_gpu``); without CUDA it says so and exits 0. The step
simulation of :mod:`stepcache.integrations.dsv4.sim` runs with CUDA tensors and the
builders' persistent CUDA buffers, uncached / hand-written / stepcache, and for each
(tokens, layers) point reports per step:

* host-to-device copies into the request-index buffers (uncached: one per consumer,
  three; hand-written and stepcache: one), all host-to-device and device-to-host
  copies, and device-to-host scalar reads (each one synchronises), counted with a
  ``TorchDispatchMode`` over one step;
* kernel launches the step issues (CUDA runtime calls on the host) and the kernels
  and memcpys the device ran, counted with ``torch.profiler`` over one step;
* the build time per step: a run is ``steps`` consecutive steps ended by
  ``torch.cuda.synchronize()``, its mean per step; median over ``repeats`` runs with
  min and max, the variants interleaved.

Results go to ``docs/benchmarks/gpu.json`` with the date and the GPU's name, and
replace the GPU section of ``docs/benchmarks.md`` (between its ``gpu:begin`` and
``gpu:end`` markers) when that page exists.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import bench_cold
from benchmarks._report import markdown_table
from benchmarks._timing import Timing, machine, progress, source_state
from benchmarks.bench_dsv4 import batch_layout
from demo import demo
from stepcache.integrations.dsv4 import sim as dsv4_sim

TOKENS: tuple[int, ...] = (1, 64, 512, 4096)
LAYERS: tuple[int, ...] = (8, 30, 61)
QUICK_TOKENS: tuple[int, ...] = (64,)
QUICK_LAYERS: tuple[int, ...] = (8,)
#: stop starting new points after this many seconds (the whole run must stay < 8 min)
BUDGET_S = 360.0

BEGIN = "<!-- gpu:begin -->"
END = "<!-- gpu:end -->"

_aten = torch.ops.aten


class CopyCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the copies between the host and ``device_type`` tensors made while it is
    active, and how many of the host-to-device ones write into ``targets`` (tensors
    that are the destination or whose view is: the request-index buffers).

    >>> buffer = torch.empty(4, dtype=torch.int32, device="meta")
    >>> with CopyCounter([buffer], device_type="meta") as counter:
    ...     _ = buffer[:2].copy_(torch.arange(2, dtype=torch.int32))
    ...     _ = torch.ones(3).to("meta")
    >>> counter.h2d, counter.h2d_into_targets, counter.d2h
    (2, 1, 0)
    """

    def __init__(self, targets: Sequence[torch.Tensor] = (), device_type: str = "cuda"):
        super().__init__()  # type: ignore[no-untyped-call]
        self.device_type = device_type
        self._targets = list(targets)  # kept alive: they are matched by id
        self.h2d = 0
        self.h2d_into_targets = 0
        self.d2h = 0
        self.scalar_reads = 0

    def _on(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == self.device_type

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is _aten.copy_.default:
            dst, src = args[0], args[1]
            if self._on(dst) and src.device.type == "cpu":
                self.h2d += 1
                base = dst if dst._base is None else dst._base
                if any(base is t for t in self._targets):
                    self.h2d_into_targets += 1
            elif self._on(src) and dst.device.type == "cpu":
                self.d2h += 1
        elif func is _aten._to_copy.default:
            src, device = args[0], kwargs.get("device")
            dst_type = None if device is None else torch.device(device).type
            if src.device.type == "cpu" and dst_type == self.device_type:
                self.h2d += 1
            elif self._on(src) and dst_type == "cpu":
                self.d2h += 1
        elif func is _aten._local_scalar_dense.default and self._on(args[0]):
            self.scalar_reads += 1
        return func(*args, **kwargs)


@attrs.frozen
class GpuPoint:
    tokens: int
    layers: int
    variant: str
    h2d_index: int
    h2d: int
    d2h: int
    scalar_reads: int
    launches: int
    kernels: int
    memcpys: int
    step_time: Timing

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "layers": self.layers,
            "variant": self.variant,
            "h2d_copies_into_index_buffers": self.h2d_index,
            "h2d_copies": self.h2d,
            "d2h_copies": self.d2h,
            "d2h_scalar_reads": self.scalar_reads,
            "kernel_launches": self.launches,
            "cuda_kernels": self.kernels,
            "cuda_memcpys": self.memcpys,
            "ns_per_step": self.step_time.to_dict(),
        }


def _profile(fn: Any) -> tuple[int, int, int]:
    """Kernel launches (host runtime calls), device kernels and device memcpys that
    ``fn()`` issues, from torch.profiler (the device counts need CUPTI)."""
    from torch.profiler import DeviceType, ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    launches = kernels = memcpys = 0
    for evt in prof.events():
        if getattr(evt, "device_type", None) == DeviceType.CUDA:
            if evt.name.startswith("Memcpy"):
                memcpys += 1
            elif not evt.name.startswith("Memset"):
                kernels += 1
        elif "LaunchKernel" in evt.name:  # cudaLaunchKernel, cuLaunchKernel, ...
            launches += 1
    return launches, kernels, memcpys


LABELS: dict[str, str] = {
    "uncached": "uncached",
    "handwritten": "hand-written",
    "stepcache": "stepcache",
}


def _counts(
    meta: dsv4_sim.StepMetadata,
    builders: dsv4_sim.Builders,
    variant: dsv4_sim.Variant,
    kinds: Sequence[str],
) -> dict[str, int]:
    """The copies of one step (dispatch mode), then the kernels of another (profiler)."""
    buffers = [
        builders.sparse_mla_buffer,
        builders.compressor_buffer,
        builders.swa_buffer,
    ]
    with CopyCounter(buffers) as c:
        demo.build_step(meta, builders, variant, kinds)
    torch.cuda.synchronize()
    meta = dsv4_sim.make_step(
        meta.query_start_loc_cpu.diff().tolist(), device=builders.device
    )
    launches, kernels, memcpys = _profile(
        lambda: demo.build_step(meta, builders, variant, kinds)
    )
    return {
        "h2d_index": c.h2d_into_targets,
        "h2d": c.h2d,
        "d2h": c.d2h,
        "scalar_reads": c.scalar_reads,
        "launches": launches,
        "kernels": kernels,
        "memcpys": memcpys,
    }


def measure_point(
    tokens: int, layers: int, steps: int, repeats: int, device: torch.device
) -> list[GpuPoint]:
    """Count, then time, one (tokens, layers) point for every variant."""
    kinds = demo.layer_kinds(layers)
    lens = batch_layout(tokens)
    variants = dsv4_sim.VARIANTS
    builders = {
        v: dsv4_sim.Builders(max_tokens=tokens, device=device) for v in variants
    }
    counts: dict[str, dict[str, int]] = {}
    for v in variants:
        for _ in range(2):  # warm up: allocator, pinned memory, kernels
            demo.build_step(
                dsv4_sim.make_step(lens, device=device), builders[v], v, kinds
            )
        torch.cuda.synchronize()
        # the metadata is made before counting: its own copies are not the step's
        counts[v] = _counts(
            dsv4_sim.make_step(lens, device=device), builders[v], v, kinds
        )
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(repeats):
        for v in variants[r % 3 :] + variants[: r % 3]:
            metas = [dsv4_sim.make_step(lens, device=device) for _ in range(steps)]
            torch.cuda.synchronize()
            start = time.perf_counter_ns()
            for meta in metas:
                demo.build_step(meta, builders[v], v, kinds)
            torch.cuda.synchronize()
            runs[v].append((time.perf_counter_ns() - start) / steps)
            del metas
    return [
        GpuPoint(
            tokens=tokens,
            layers=layers,
            variant=LABELS[v],
            step_time=Timing.of(LABELS[v], runs[v]),
            **counts[v],
        )
        for v in variants
    ]


def count_syncs(fn: Any) -> int:
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


def request_index_rows(
    device: torch.device, steps: int, repeats: int
) -> list[dict[str, Any]]:
    """The request-index rows of ``benchmarks.bench_cold`` on the device: per step,
    three consumers of one fresh metadata object, and V2's six groups (stepcache
    inside a scope, the seed's slot hand-threaded), stepcache against the seeds'
    code (hand-written and uncached). Per variant: host-to-device copies into the
    index buffers and synchronisations in one step, then the step time (``steps``
    steps ended by a synchronisation, median over ``repeats`` runs, the variants
    interleaved)."""
    out = []
    for shape, make in bench_cold.SHAPES.items():
        layouts = {v: bench_cold.Layout(device) for v in bench_cold.VARIANTS}
        step = {v: make(v) for v in bench_cold.VARIANTS}
        counts: dict[str, tuple[int, int]] = {}
        expected = None
        for v in bench_cold.VARIANTS:
            layout = layouts[v]
            for _ in range(2):  # warm up: allocator, pinned memory
                step[v](layout)
            torch.cuda.synchronize()
            with CopyCounter(layout.buffers) as copies:
                syncs = count_syncs(lambda: step[v](layout))  # noqa: B023
            rows = [r.tolist() for r in step[v](layout)]
            expected = expected or rows
            if rows != expected:
                raise AssertionError(f"{shape}, {v}: rows {rows} != {expected}")
            counts[v] = (copies.h2d_into_targets, syncs)
        runs: dict[str, list[float]] = {v: [] for v in bench_cold.VARIANTS}
        order = list(bench_cold.VARIANTS)
        for r in range(repeats):
            for v in order[r % 3 :] + order[: r % 3]:
                torch.cuda.synchronize()
                start = time.perf_counter_ns()
                for _ in range(steps):
                    step[v](layouts[v])
                torch.cuda.synchronize()
                runs[v].append((time.perf_counter_ns() - start) / steps)
        for v in bench_cold.VARIANTS:
            out.append(
                {
                    "shape": shape,
                    "variant": v,
                    "h2d_copies_into_index_buffers": counts[v][0],
                    "synchronisations": counts[v][1],
                    "ns_per_step": Timing.of(v, runs[v]).to_dict(),
                }
            )
    return out


def run(
    tokens: Sequence[int] = TOKENS,
    layers: Sequence[int] = LAYERS,
    steps: int = 10,
    repeats: int = 7,
    budget_s: float = BUDGET_S,
) -> dict[str, Any]:
    device = torch.device("cuda", torch.cuda.current_device())
    started = time.monotonic()
    progress("bench_gpu: the request index per step ...")
    index_rows = request_index_rows(device, steps=max(steps, 10) * 10, repeats=repeats)
    points: list[GpuPoint] = []
    skipped: list[str] = []
    for n_layers in layers:
        for n_tokens in tokens:
            if time.monotonic() - started > budget_s:
                skipped.append(f"{n_tokens} tokens x {n_layers} layers")
                continue
            progress(f"bench_gpu: {n_tokens:>5} tokens, {n_layers:>2} layers ...")
            points += measure_point(n_tokens, n_layers, steps, repeats, device)
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "gpu": torch.cuda.get_device_name(device),
        "environment": (
            f"Python {platform.python_version()}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}"
        ),
        "command": "python scripts/gpu_bench.py",
        "source": source_state(),
        "machine": machine(),
        "steps_per_run": steps,
        "repeats": repeats,
        "points": [p.to_dict() for p in points],
        "request_index": index_rows,
        "skipped_for_time": skipped,
    }


def _at_commit(data: dict[str, Any]) -> str:
    """`` at commit ...`` for a run that recorded its commit (older runs did not)."""
    source = data.get("source") or {}
    if not source.get("commit"):
        return ""
    dirty = ", with uncommitted changes" if source.get("dirty") else ""
    return f", at commit `{source['commit'][:12]}`{dirty}"


def render(data: dict[str, Any]) -> str:
    """The GPU section of docs/benchmarks.md, from :func:`run`'s data."""
    rows = []
    for p in data["points"]:
        t = p["ns_per_step"]
        rows.append(
            [
                str(p["layers"]),
                str(p["tokens"]),
                p["variant"],
                str(p["h2d_copies_into_index_buffers"]),
                str(p["h2d_copies"]),
                str(p["d2h_copies"] + p["d2h_scalar_reads"]),
                str(p["kernel_launches"]),
                str(p["cuda_kernels"]),
                f"{t['median_ns'] / 1e6:.3f} ({t['min_ns'] / 1e6:.3f}-"
                f"{t['max_ns'] / 1e6:.3f})",
            ]
        )
    header = [
        "layers",
        "tokens",
        "variant",
        "H2D copies into the index buffers",
        "all H2D copies",
        "D2H copies and scalar reads",
        "kernel launches",
        "kernels run",
        "ms per step, synchronised (min-max)",
    ]
    text = [
        f"Measured on {data['gpu']}, {data['date']}, with `{data['command']}` "
        f"({data['environment']}){_at_commit(data)}. Counts are per step; times are "
        f"the median over {data['repeats']} runs of {data['steps_per_run']} steps.",
        "",
        markdown_table(header, rows, "rrlrrrrrr"),
    ]
    if data.get("request_index"):
        text += ["", render_request_index(data["request_index"])]
    if data["skipped_for_time"]:
        text += [
            "",
            "Not measured (time budget): " + ", ".join(data["skipped_for_time"]),
        ]
    return "\n".join(text)


def render_request_index(rows: Sequence[dict[str, Any]]) -> str:
    """The request-index rows, with each variant's step time over the seed's
    hand-written one of the same shape."""
    base = {
        r["shape"]: r["ns_per_step"]["median_ns"]
        for r in rows
        if r["variant"] == "hand-written"
    }
    table = [
        [
            r["shape"],
            r["variant"],
            str(r["h2d_copies_into_index_buffers"]),
            str(r["synchronisations"]),
            f"{r['ns_per_step']['median_ns'] / 1e3:.1f}",
            f"{r['ns_per_step']['median_ns'] / base[r['shape']]:.2f}x",
        ]
        for r in rows
    ]
    header = [
        "request index per step",
        "variant",
        "H2D copies into the index buffers",
        "synchronisations",
        "us per step, synchronised",
        "/ hand-written",
    ]
    return (
        "The request index alone (`benchmarks.bench_cold`'s rows on the device): "
        "three consumers of one fresh metadata object, and V2's six groups "
        "(stepcache inside a scope, the seed's slot hand-threaded). *hand-written* "
        "and *uncached* are the seeds' code (`stepcache/integrations/dsv4/seed.py`); "
        'synchronisations are counted with `torch.cuda.set_sync_debug_mode("warn")`.\n\n'
        + markdown_table(header, table, "llrrrr")
    )


NOT_MEASURED = (
    "The GPU numbers have not been measured yet. On a machine with one CUDA GPU, run\n"
    "\n"
    "    python scripts/gpu_bench.py\n"
    "\n"
    "(under 8 minutes). It runs the step simulation with CUDA tensors and persistent\n"
    "buffers and reports per step the host-to-device copies issued for the request\n"
    "index (uncached: one per consumer; stepcache: one), the kernel launches and the\n"
    "build time, writes them to `docs/benchmarks/gpu.json` with the date and the GPU's\n"
    "name, and puts the table here.\n"
    "\n"
    "The CUDA tests (`tests/cuda`, run by `scripts/gpu_check.sh`: pinned staging, a\n"
    "copy that does not block the host, CUDA-graph capture and replay) have no\n"
    "recorded GPU run either: no GPU was available. CUDA-graph safety is tested on the\n"
    "CPU only (see [Limits](limits.md))."
)


def section(out_dir: Path) -> str:
    """The GPU section: the saved results if there are any, else how to make them."""
    saved = out_dir / "benchmarks" / "gpu.json"
    body = render(json.loads(saved.read_text())) if saved.exists() else NOT_MEASURED
    return f"{BEGIN}\n{body}\n{END}"


def write(data: dict[str, Any], out_dir: Path) -> None:
    saved = out_dir / "benchmarks" / "gpu.json"
    saved.parent.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    page = out_dir / "benchmarks.md"
    if page.exists():
        text = page.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            _, tail = rest.split(END, 1)
            page.write_text(head + section(out_dir) + tail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--quick", action="store_true", help="one point, a smoke run")
    parser.add_argument("--steps", type=int, default=10, help="steps per run")
    parser.add_argument("--repeats", type=int, default=7, help="runs per variant")
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="docs folder to write into"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here; nothing measured (needs one GPU)")
        return 0
    if args.quick:
        data = run(QUICK_TOKENS, QUICK_LAYERS, steps=2, repeats=2)
    else:
        data = run(steps=args.steps, repeats=args.repeats)
    print(render(data))
    if not args.no_write and not args.quick:
        write(data, args.out)
        print(f"\nwritten to {args.out / 'benchmarks' / 'gpu.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
