# SPDX-License-Identifier: Apache-2.0
"""Smoke tests of ``python -m demo`` (the repository's demo) with tiny sizes (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import stepcache
from demo import demo


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
