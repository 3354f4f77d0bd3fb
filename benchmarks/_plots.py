# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from benchmarks.bench_dsv4 import GOAL, Dsv4Results  # noqa: E402
from benchmarks.bench_hit import HitResults  # noqa: E402
from benchmarks.bench_soak import SoakResults  # noqa: E402

_COLORS = {"uncached": "tab:red", "hand-written": "tab:gray", "stepcache": "tab:blue"}
# No timestamp in the files: the same numbers give the same bytes.
_META = {"Software": None}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata=_META)
    plt.close(fig)
    return path


def plot_hits(results: HitResults, path: Path) -> Path:
    """Horizontal bars: median ns per hit, min-max as error bars."""
    rows = list(results.timings.values())[::-1]
    fig, ax = plt.subplots(figsize=(12, 0.38 * len(rows) + 1.2))
    medians = [t.median_ns for t in rows]
    errors = [
        [t.median_ns - t.min_ns for t in rows],
        [t.max_ns - t.median_ns for t in rows],
    ]
    colors = [
        "tab:blue"
        if t.label.startswith(("stepcache", "request index: stepcache"))
        else "tab:gray"
        for t in rows
    ]
    ax.barh([t.label for t in rows], medians, xerr=errors, color=colors, capsize=2)
    ax.set_xscale("log")
    ax.set_xlabel("ns per call (median, min-max; log scale)")
    ax.set_title("Cost of one call: cache hits, disabled mode, no cache")
    ax.tick_params(axis="y", labelsize=8)
    return _save(fig, path)


def plot_dsv4_times(results: Dsv4Results, path: Path) -> Path:
    """Build time per step vs tokens, one panel per layer count."""
    layers = sorted({p.layers for p in results.points})
    fig, axes = plt.subplots(
        1, len(layers), figsize=(4 * len(layers), 3.6), squeeze=False
    )
    for ax, n_layers in zip(axes[0], layers, strict=True):
        pts = [p for p in results.points if p.layers == n_layers]
        x = [p.tokens for p in pts]
        for variant, color in _COLORS.items():
            t = [p.timings[variant] for p in pts]
            y = [v.median_ns / 1e6 for v in t]
            err = [
                [(v.median_ns - v.min_ns) / 1e6 for v in t],
                [(v.max_ns - v.median_ns) / 1e6 for v in t],
            ]
            ax.errorbar(
                x,
                y,
                yerr=err,
                label=variant,
                color=color,
                marker="o",
                markersize=3,
                capsize=2,
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(x, [str(n) for n in x])
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("tokens in the batch")
        ax.set_ylabel("ms per step (median, min-max)")
        ax.set_title(f"{n_layers} layers")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("DSv4 metadata build per step")
    return _save(fig, path)


def plot_dsv4_ratio(results: Dsv4Results, path: Path) -> Path:
    """uncached/stepcache (the speed-up) and stepcache/hand-written (the goal)."""
    layers = sorted({p.layers for p in results.points})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for n_layers in layers:
        pts = [p for p in results.points if p.layers == n_layers]
        x = [p.tokens for p in pts]
        left.plot(
            x,
            [p.ratio("uncached", "stepcache") for p in pts],
            marker="o",
            label=f"{n_layers} layers",
        )
        right.plot(
            x,
            [p.ratio("stepcache", "hand-written") for p in pts],
            marker="o",
            label=f"{n_layers} layers",
        )
    left.set_title("uncached / stepcache (higher: stepcache saves more)")
    left.axhline(1.0, color="black", linewidth=0.8)
    right.set_title("stepcache / hand-written (goal: below the line)")
    right.axhline(
        GOAL.limit, color="tab:red", linestyle="--", label=f"goal {GOAL.limit}x"
    )
    right.axhline(1.0, color="black", linewidth=0.8)
    ticks = sorted({p.tokens for p in results.points})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.set_xlabel("tokens in the batch")
        ax.set_ylabel("median of the per-step ratios")
        ax.grid(True, alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_soak(results: SoakResults, path: Path) -> Path:
    """Resident memory over the soak."""
    fig, ax = plt.subplots(figsize=(7, 3.4))
    steps = [s for s, _ in results.rss_samples]
    rss = [r / 2**20 for _, r in results.rss_samples]
    ax.plot(steps, rss, color="tab:blue", label="RSS")
    base = results.rss_before / 2**20
    ax.axhline(base + 1.0, color="tab:red", linestyle="--", label="goal: +1 MiB")
    ax.set_ylim(min(rss) - 1.0, max(max(rss), base + 1.0) + 1.0)
    ax.set_xlabel("step")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_title(
        f"Memory soak: {results.steps:,} steps; live entries after every step: "
        f"max {results.max_live_after}"
    )
    ax.legend()
    ax.grid(True, alpha=0.3)
    return _save(fig, path)
