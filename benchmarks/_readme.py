# SPDX-License-Identifier: Apache-2.0
"""The measured figures of README.md and docs/index.md, generated from results.json.

``python -m benchmarks.run_all`` rewrites the block between :data:`START` and
:data:`END` in both pages from the ``results.json`` it writes, and
``tests/benchmarks/test_readme_figures.py`` checks that the committed pages hold the
block the committed ``results.json`` gives, so the figures cannot drift from the run.
A figure the results do not hold (a row added after the run) reads "not measured yet".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import _engine_page, bench_hit
from benchmarks._report import markdown_table

__all__ = [
    "END",
    "START",
    "block",
    "current_block",
    "load_engine",
    "main",
    "replace_block",
    "rewrite",
    "summary_line",
]

START = "<!-- bench:start -->"
END = "<!-- bench:end -->"
NOT_MEASURED = "not measured yet"
#: where the plugin's real-engine benchmark (issue 20, ``benchmarks/bench_engine.py``)
#: leaves its results, relative to the docs folder
ENGINE_RESULTS = "benchmarks/engine.json"

# (row of bench_hit, what the README calls it)
_CALLS = [
    (
        bench_hit.RIX,
        "request index, stepcache hit: re-checks 2 tensors, 1 int and "
        "its result's version counter, returns the stored tensor",
    ),
    (
        bench_hit.RIX_INFERENCE,
        "request index, stepcache hit on a layout of inference tensors (made under "
        "`torch.inference_mode()`, as a vLLM step makes its own): re-checks 2 tensors' "
        "data pointer, shape, strides, dtype and device, 1 int and its result's "
        "version counter",
    ),
    (
        bench_hit.RIX_SEED,
        "request index, stock vLLM's method (the seeds' hand-written "
        "hit): 3 asserts + a new slice each call",
    ),
    (
        bench_hit.RIX_KEPT,
        "request index, a hand-written cache that keeps its slice: "
        "returns it, checks nothing",
    ),
    (bench_hit.KEY, "stepcache hit, key of one argument, no dependency (`return k`)"),
    (bench_hit.LRU, "`functools.lru_cache` hit, the same method"),
    (
        bench_hit.KEY_DISABLED,
        "the same stepcache method under `stepcache.disabled()` "
        "(calls through every time)",
    ),
    (bench_hit.PLAIN, "the same method, undecorated"),
]
# (measured row, baseline row, what the README calls the ratio)
_RATIOS = [
    (
        bench_hit.RIX,
        bench_hit.RIX_SEED,
        "request index: stepcache hit / stock vLLM's method (3 asserts + new slice)",
    ),
    (
        bench_hit.RIX_INFERENCE,
        bench_hit.RIX_SEED,
        "request index, layout of inference tensors: stepcache hit / stock vLLM's "
        "method",
    ),
    (
        bench_hit.RIX,
        bench_hit.RIX_KEPT,
        "request index: stepcache hit / hand-written cache that keeps its slice",
    ),
    (bench_hit.KEY, bench_hit.LRU, "keyed stepcache hit / `functools.lru_cache` hit"),
    (
        bench_hit.KEY_DISABLED,
        bench_hit.PLAIN,
        "a call in disabled mode / the undecorated method",
    ),
]


def summary_line(raw: dict[str, Any], docs: str) -> str:
    """When, on what code, how and where the numbers were measured."""
    machine = raw.get("machine")
    if machine:
        where = (
            f"{machine['cpu']}, {machine['cores']} cores "
            f"({machine['cores_usable']} usable), {machine['memory_gib']} GiB, "
            f"Python {machine['python']}, torch {machine['torch']} "
            f"(torch threads: {machine['torch_threads']})"
        )
    else:
        where = raw.get("environment", "an unrecorded machine")
    return (
        f"Measured with `{raw['command']}` on {raw['date']} {_engine_page.code(raw)}; {where}. "
        f"Every table: [benchmarks]({docs}benchmarks.md); the raw numbers, with the "
        f"commit and the machine: [results.json]({docs}benchmarks/results.json)."
    )


def block(
    raw: dict[str, Any], docs: str, *, engine: dict[str, Any] | None = None
) -> str:
    """The Markdown between the markers, from ``results.json`` as loaded.

    ``docs`` is the path from the page to the docs folder (``"docs/"`` from the
    README, ``""`` from docs/index.md); ``engine`` is the real-engine results
    (:data:`ENGINE_RESULTS`, as loaded), if there are any.
    """
    hit = raw.get("hit", {})
    ns = hit.get("ns_per_call", {})
    ratios = {
        (r["measured"], r["baseline"]): r["ratio"]
        for r in [*hit.get("goals", []), *hit.get("comparisons", [])]
    }
    calls = [
        [name, f"{ns[row]['median_ns']:.0f}" if row in ns else NOT_MEASURED]
        for row, name in _CALLS
    ]
    rows = [
        [name, f"{ratios[m, b]:.2f}x" if (m, b) in ratios else NOT_MEASURED]
        for m, b, name in _RATIOS
    ]
    # the cold path (benchmarks.bench_cold): every row, as the run labelled it
    rows += [
        [r["label"], f"{r['ratio']:.2f}x"] for r in raw.get("cold", {}).get("rows", [])
    ]
    dsv4 = raw.get("dsv4", {}).get("points", [])
    if dsv4:
        step = [p["paired_ratios"]["stepcache/hand-written"] for p in dsv4]
        rows.append(
            [
                "DSv4 step simulation (CPU, no engine), metadata build: stepcache / "
                "the seeds' hand-written caches (median of the per-round ratios; "
                f"lowest and highest of {len(dsv4)} batch sizes and layer counts)",
                f"{min(step):.3f}x-{max(step):.3f}x",
            ]
        )
    rows += _engine_page.readme_rows(engine)
    engine_line = (
        "The vLLM rows: from `python -m benchmarks.bench_engine` (each section's "
        f"commit is in [engine.json]({docs}{ENGINE_RESULTS}) and on the benchmarks "
        "page)."
        if engine
        else ""
    )
    return "\n".join(
        [
            START,
            "<!-- generated by `python -m benchmarks.run_all` from the results.json "
            "it writes (and engine.json, when benchmarks.bench_engine made one); "
            "do not edit by hand -->",
            summary_line(raw, docs),
            "",
            markdown_table(["one call (median over the runs)", "ns"], calls, "lr"),
            "",
            markdown_table(["ratio (of medians)", "measured"], rows, "lr"),
            *(["", engine_line] if engine_line else []),
            END,
        ]
    )


def replace_block(text: str, new_block: str) -> str:
    """``text`` with its block between the markers replaced by ``new_block``."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} block to replace")
    return text[:start] + new_block + text[end + len(END) :]


def current_block(text: str) -> str:
    """The block between the markers of ``text``, markers included."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"no {START} ... {END} block")
    return text[start : end + len(END)]


def load_engine(docs_dir: Path) -> dict[str, Any] | None:
    """The real-engine results in ``docs_dir`` (:data:`ENGINE_RESULTS`), if any."""
    path = docs_dir / ENGINE_RESULTS
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def rewrite(
    page: Path, raw: dict[str, Any], docs: str, *, engine: dict[str, Any] | None
) -> None:
    """Replace the block in the page at ``page`` with the one ``raw`` gives."""
    page.write_text(replace_block(page.read_text(), block(raw, docs, engine=engine)))


ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    """Rewrite the README's and the home page's figures, and the benchmarks page's
    vLLM section, from the results files as they are (nothing is run): after
    ``benchmarks.bench_engine``, or to check what a results file gives."""
    docs = ROOT / "docs"
    raw = json.loads((docs / "benchmarks" / "results.json").read_text())
    engine = load_engine(docs)
    for page, prefix in ((ROOT / "README.md", "docs/"), (docs / "index.md", "")):
        rewrite(page, raw, prefix, engine=engine)
    rewrite_engine_section(docs / "benchmarks.md", engine)
    print("benchmarks._readme: rewrote README.md, docs/index.md, docs/benchmarks.md")
    return 0


def rewrite_engine_section(page: Path, engine: dict[str, Any] | None) -> None:
    """Replace the vLLM section of the benchmarks page at ``page``."""
    text = page.read_text()
    start, end = text.find(_engine_page.BEGIN), text.find(_engine_page.END)
    if start < 0 or end < start:
        raise ValueError(f"{page}: no {_engine_page.BEGIN} ... {_engine_page.END}")
    new = _engine_page.section(engine)
    page.write_text(text[:start] + new + text[end + len(_engine_page.END) :])


if __name__ == "__main__":
    raise SystemExit(main())
