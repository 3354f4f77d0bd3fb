# SPDX-License-Identifier: Apache-2.0
"""Smoke tests of the benchmarks' code paths with tiny sizes (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

# The benchmarks live in the checkout's top-level folder (they are not installed).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    _engine_page,
    _readme,
    bench_cold,
    bench_dsv4,
    bench_floor,
    bench_gpu,
    bench_hit,
    bench_import,
    bench_soak,
    bench_stages,
    run_all,
)
from stepcache.integrations.dsv4.seed import SeedMetadata  # noqa: E402


def test_hit_every_row_has_its_benchmarks() -> None:
    goals, comparisons, names = bench_hit.selected("")
    # a full run: every goal and comparison, every benchmark, each row's sides in turn
    assert (goals, comparisons) == (bench_hit.GOALS, bench_hit.COMPARISONS)
    assert set(names) == set(bench_hit.BENCHES) == {c[0] for c in bench_hit.CALLS}
    for row in goals + comparisons:
        assert {row.measured, row.baseline} <= set(bench_hit.BENCHES)
        assert row.label == f"{row.measured} / {row.baseline}"
    assert all(r.limit is not None for r in goals)
    assert all(r.limit is None for r in comparisons)
    for bench in bench_hit.BENCHES.values():
        assert bench.prepare()(3) > 0  # loops -> seconds, as pyperf times it


def test_hit_rows_under_pyperf(tmp_path: Path) -> None:
    # two processes of two values each, fixed loops: what the JSON and the page get
    results = bench_hit.run(
        tmp_path / "hit.json",
        ("-p", "2", "-n", "2", "-w", "0", "--loops", "50", "--rows", "/ functools.lru"),
    )
    (goal,) = results["goals"]
    assert (goal["measured"], goal["baseline"], goal["limit"], goal["set_by"]) == (
        bench_hit.KEY,
        bench_hit.LRU,
        1.6,
        "issue 56",
    )
    assert goal["ratio"] > 0 and isinstance(goal["met"], bool)
    # pyperf's significance test: two samples of 4 values each
    assert isinstance(goal["significant"], bool) and goal["t_score"] is not None
    assert results["comparisons"] == []
    assert {"command", "date", "source", "machine", "pyperf"} <= set(results)
    assert list(results["ns_per_call"]) == [bench_hit.KEY, bench_hit.LRU]
    for summary in results["ns_per_call"].values():
        # every benchmark pools the values of both processes
        assert (summary["processes"], summary["values"]) == (2, 4)
        assert summary["min_ns"] <= summary["median_ns"] <= summary["max_ns"]
    text = bench_hit.render(results)
    assert "| goal (ratio of medians)" in text and "| issue 56 |" in text
    assert "comparison (ratio of medians, no goal)" in text
    timings = bench_hit.HitResults.of(results).timings
    assert (
        timings[bench_hit.LRU].median_ns
        == results["ns_per_call"][bench_hit.LRU]["median_ns"]
    )


def test_dsv4_rounds_split_between_fresh_processes() -> None:
    results = bench_dsv4.run(tokens=(2,), layers=(3, 4), rounds=3, processes=2)
    assert (results.rounds, results.processes) == (3, 2)
    assert [(p.tokens, p.layers) for p in results.points] == [(2, 3), (2, 4)]
    for point in results.points:
        # 2 rounds in the first process, 1 in the second, pooled
        assert all(len(ns) == 3 for ns in point.runs.values())
        assert set(point.runs) == {
            "uncached",
            "hand-written",
            "stepcache",
            bench_dsv4.CONTROL,
            bench_dsv4.STEPCACHE_AGAIN,
        }
        assert point.work["stepcache"] == point.work["hand-written"]
        assert bench_dsv4.Point.from_raw(point.raw()) == point
    with pytest.raises(ValueError, match="processes must be between 1 and rounds"):
        bench_dsv4.run(tokens=(2,), layers=(3,), rounds=1, processes=2)
    with pytest.raises(ValueError, match="the same point"):
        bench_dsv4.Point.pooled(results.points)


def test_the_seed_hit_is_the_seed_prs_method() -> None:
    qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    meta = SeedMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    buffer = torch.full((8,), -1, dtype=torch.int32)
    first = meta.token_to_req_indices(buffer)
    assert first.tolist() == [0, 0, 2, 2, 2, 0, 0]
    assert meta.token_to_req_indices(buffer).data_ptr() == first.data_ptr()


def test_cold_request_index_work_per_step() -> None:
    # counted, not timed: copies into the three consumers' buffers per step
    assert bench_cold.work_per_step() == {
        "three consumers": {"stepcache": 1, "hand-written": 1, "uncached": 3},
        "six groups": {"stepcache": 1, "hand-written": 1, "uncached": 6},
    }


def test_cold_every_row_has_its_benchmarks() -> None:
    for row in bench_cold.ROWS:
        assert {row.measured, row.baseline} <= set(bench_cold.BENCHES)
    for bench in bench_cold.BENCHES.values():
        assert bench.prepare()(3) > 0  # loops -> seconds, as pyperf times it


def test_cold_runs_under_pyperf(tmp_path: Path) -> None:
    # one row, one value in one worker each: what the JSON and the page get
    results = bench_cold.run(
        tmp_path / "cold.json",
        ("--debug-single-value", "--rows", "1,000 owners alive"),
    )
    (row,) = results["rows"]
    assert (row["measured"], row["baseline"], row["limit"]) == (
        "cold 1000 alive/stepcache",
        "cold 1000 alive/cached_property",
        2.0,
    )
    assert row["ratio"] > 0 and isinstance(row["met"], bool)
    assert {"command", "date", "source", "machine", "pyperf"} <= set(results)
    assert set(results["benchmarks"]) == {row["measured"], row["baseline"]}
    text = bench_cold.render(results)
    assert "| row (ratio of medians)" in text and "1,000 owners alive" in text
    assert bench_cold.goal_rows(results).count("\n") == 0


def test_dsv4_points_and_work() -> None:
    results = bench_dsv4.run(tokens=(1, 5), layers=(3,), rounds=2)
    assert [(p.tokens, p.layers) for p in results.points] == [(1, 3), (5, 3)]
    work = results.points[0].work
    # layers: swa_only, swa_only, c4a
    assert work == {"uncached": (3, 3), "hand-written": (1, 2), "stepcache": (1, 2)}
    assert len(results.goals) == 2
    assert "stepcache / hand-written" in bench_dsv4.render(results)


def test_floor_points_have_every_variant() -> None:
    results = bench_floor.run(tokens=(3,), layers=(4,), rounds=2)
    (point,) = results.points
    assert set(point.runs) == set(bench_floor.VARIANTS)
    assert all(len(ns) == 2 for ns in point.runs.values())
    assert point.ratio("hand-written") == 1.0
    assert "minimal decorator / hand-written" in bench_floor.render(results)


@pytest.mark.parametrize("label", list(bench_floor.VARIANTS))
def test_floor_variants_cache_as_the_seed(label: str) -> None:
    # layers: swa_only, swa_only, c4a, c128a, c4a, c128a: each variant builds the
    # request index once and the sparse indices 4 times (swa_only, c128a, two c4a)
    builders = bench_floor.FloorBuilders(max_tokens=8)
    kinds = ("swa_only", "swa_only", "c4a", "c128a", "c4a", "c128a")
    meta = bench_floor.dsv4_sim.make_step([2, 1, 3], pad_to=8)
    reference = bench_floor.demo.build_step(
        bench_floor.dsv4_sim.make_step([2, 1, 3], pad_to=8),
        bench_floor.dsv4_sim.Builders(max_tokens=8),
        "uncached",
        kinds,
    )
    variant = bench_floor.VARIANTS[label]
    result = bench_floor.demo.build_step(meta, builders, variant, kinds)  # type: ignore[arg-type]
    assert bench_floor.demo.same_result(result, reference)
    assert builders.sparse_builds == 4
    assert result.sparse[3][0] is result.sparse[5][0]  # the c128a layers share one
    assert result.sparse[2][0] is not result.sparse[4][0]  # the c4a layers do not


def test_the_minimal_decorator_keeps_a_store_per_owner() -> None:
    import copy

    class Owner:
        pass

    calls: list[str] = []

    @bench_floor.minimal_cached(frozenset({"a"}))
    def f(owner: object, kind: str, num_rows: int | None) -> tuple[str, int]:
        calls.append(kind)
        return (kind, len(calls))

    owner = Owner()
    assert f(owner, "a", 1) is f(owner, "a", 1)
    assert f(owner, "a", 2) != f(owner, "a", 1)  # the row count is in the key
    assert f(owner, "b", 1) != f(owner, "b", 1)  # outside only: never cached
    assert f(copy.copy(owner), "a", 1) != f(owner, "a", 1)  # a copy: its own store
    assert calls == ["a", "a", "b", "b", "a"]


def test_batch_layout() -> None:
    assert bench_dsv4.batch_layout(1) == [1]
    lens = bench_dsv4.batch_layout(4096)
    assert sum(lens) == 4096 and lens.count(1) == 256 and max(lens) == 1024


def test_the_soak_leaves_no_live_entries() -> None:
    results = bench_soak.soak(steps=40, warmup=4)
    assert results.max_live_during >= 1
    assert results.max_live_after == 0 and results.steps_with_live_after == 0
    assert len(results.segment_growth) == bench_soak.SEGMENTS
    assert "live entries once it is gone" in bench_soak.render(results)


def test_the_soak_counts_only_the_entries_of_stores_made_after_it_began() -> None:
    from stepcache._store import live_caches

    class SWA:
        pass

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)

    # an owner that outlives the soak (a parametrized test's, say) is not its leak
    older = SWA()
    bench_soak.sparse_index.sparse_index(older, "c128a", None, build)
    before = frozenset(id(store) for store in live_caches())
    assert bench_soak.live_entries() >= 1
    assert bench_soak.live_entries(before) == 0
    # one made after it began is, while it lives
    newer = SWA()
    bench_soak.sparse_index.sparse_index(newer, "c128a", None, build)
    bench_soak.sparse_index.sparse_index(newer, "swa_only", None, build)
    bench_soak.sparse_index.sparse_index(newer, "c4a", None, build)
    assert bench_soak.live_entries(before) == 2
    del newer
    assert bench_soak.live_entries(before) == 0
    assert older is not None


def test_run_all_writes_the_page_and_plots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny: dict[str, Any] = {
        "hit": {"options": ("--debug-single-value", "--rows", "no checks) / ")},
        "dsv4": {"tokens": (1, 4), "layers": (3, 4), "rounds": 1},
        "soak": {"steps": 20, "warmup": 2},
        "stages": {"layers": 3, "tokens": 2, "rounds": 1},
        "floor": {"tokens": (2,), "layers": (3,), "rounds": 1},
        "imports": {"processes": 1, "warmup": 0},
        "cold": {"options": ("--debug-single-value", "--rows", "six owners")},
    }
    monkeypatch.setattr(run_all, "QUICK", tiny)
    assert run_all.main(["--quick", "--out", str(tmp_path)]) == 0
    page = (tmp_path / "benchmarks.md").read_text()
    assert "Quick smoke run" in page and "python -m benchmarks.run_all --quick" in page
    assert "The GPU numbers have not been measured yet" in page
    assert "### Where the difference goes" in page and "layer 2 (c4a)" in page
    assert "minimal decorator / hand-written" in page
    assert "### The cold path" in page and "stepcache inside a scope" in page
    assert "## 6. Import time" in page and "median of 1 processes" in page
    assert "| import stepcache over import torch (" in page
    for name in ("hit_cost", "dsv4_build_time", "dsv4_ratio", "soak"):
        png = tmp_path / "benchmarks" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG"
        assert f"(benchmarks/{name}.png)" in page
    raw = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    assert set(raw) >= {
        "hit",
        "dsv4",
        "soak",
        "floor",
        "imports",
        "cold",
        "environment",
        "date",
    }
    assert [r["measured"] for r in raw["cold"]["rows"]] == ["scope 6x3/stepcache"]
    assert raw["imports"]["lazy_loaded"] == []
    assert len(raw["imports"]["stepcache_us_per_process"]) == 1
    # what was measured, how and where
    assert raw["command"] == f"python -m benchmarks.run_all --quick --out {tmp_path}"
    assert set(raw["source"]) == {"commit", "dirty", "dirty_paths"}
    assert raw["machine"]["torch"] == torch.__version__
    # the hit (its own pyperf run): one comparison's two sides, in the JSON and the page
    assert list(raw["hit"]["ns_per_call"]) == [bench_hit.RIX_KEPT, bench_hit.RIX_SEED]
    assert [r["measured"] for r in raw["hit"]["comparisons"]] == [bench_hit.RIX_KEPT]
    assert json.loads((tmp_path / "benchmarks" / "hit.json").read_text()) == raw["hit"]
    assert "comparison (ratio of medians, no goal)" in page
    # no engine.json in the run's folder: the vLLM section says how to make one
    assert "## 5. The vLLM plugin against stock vLLM" in page
    assert _engine_page.section(None) in page
    assert bench_hit.RIX_KEPT in page and bench_hit.RIX_SEED in page
    # a run into another folder rewrites copies of the pages there, not the checkout's
    for name, docs in (("README.md", "docs/"), ("index.md", "")):
        text = (tmp_path / name).read_text()
        assert _readme.current_block(text) == _readme.block(raw, docs)


def test_copy_counter_counts_host_to_device_copies() -> None:
    target = torch.empty(8, dtype=torch.int32, device="meta")
    other = torch.empty(8, dtype=torch.int32, device="meta")
    with bench_gpu.CopyCounter([target], device_type="meta") as counter:
        target[:3].copy_(torch.arange(3, dtype=torch.int32))
        other[:3].copy_(torch.arange(3, dtype=torch.int32))
        torch.ones(2).to("meta")
        torch.ones(2).clone()
    assert (counter.h2d, counter.h2d_into_targets, counter.d2h) == (3, 1, 0)


def _fake_gpu_data() -> dict[str, Any]:
    timing = {"median_ns": 2e6, "min_ns": 1e6, "max_ns": 3e6}
    point = {
        "tokens": 64,
        "layers": 8,
        "variant": "stepcache",
        "h2d_copies_into_index_buffers": 1,
        "h2d_copies": 1,
        "d2h_copies": 1,
        "d2h_scalar_reads": 0,
        "kernel_launches": 121,
        "cuda_kernels": 120,
        "cuda_memcpys": 2,
        "ns_per_step": timing,
    }
    return {
        "date": "2026-01-01 00:00 UTC",
        "gpu": "Fake GPU",
        "environment": "test",
        "command": "python scripts/gpu_bench.py",
        "steps_per_run": 1,
        "repeats": 1,
        "points": [point],
        "skipped_for_time": [],
    }


def test_gpu_results_replace_the_pages_gpu_section(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks.md"
    page.write_text(f"# B\n\n{bench_gpu.section(tmp_path)}\n\n## After\n")
    assert "not been measured yet" in page.read_text()
    bench_gpu.write(_fake_gpu_data(), tmp_path)
    text = page.read_text()
    assert "Measured on Fake GPU, 2026-01-01 00:00 UTC" in text
    assert "at commit" not in text  # the fake run recorded none
    assert "not been measured" not in text and text.endswith("## After\n")
    assert (tmp_path / "benchmarks" / "gpu.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU-only path")
def test_the_gpu_script_skips_cleanly_without_cuda(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_bench.py")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA device here" in done.stdout


def test_gpu_point_code_path_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_point with CPU tensors: synchronize and the profiler stubbed out."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_gpu, "_profile", lambda fn: (fn(), (7, 6, 1))[1])
    points = bench_gpu.measure_point(
        4, 3, steps=1, repeats=1, device=torch.device("cpu")
    )
    assert [p.variant for p in points] == ["uncached", "hand-written", "stepcache"]
    assert all(p.h2d == 0 and p.kernels == 6 for p in points)  # no CUDA copies on CPU
    data = {**_fake_gpu_data(), "points": [p.to_dict() for p in points]}
    assert bench_gpu.render(data).count("| 3 | 4 |") == 3
    data["source"] = {"commit": "a" * 40, "dirty": True, "dirty_paths": ["x"]}
    assert "at commit `aaaaaaaaaaaa`, with uncommitted changes." in bench_gpu.render(
        data
    )


def test_stages_time_every_builder_and_layer() -> None:
    results = bench_stages.run(layers=4, tokens=3, rounds=2)
    assert list(results.stages) == [
        "sparse-MLA builder (request index)",
        "compressor builder (request index)",
        "sparse-SWA builder (request index)",
        "layer 0 (swa_only)",
        "layer 1 (swa_only)",
        "layer 2 (c4a)",
        "layer 3 (c128a)",
    ]
    assert all(h > 0 and s > 0 for h, s in results.stages.values())
    table = bench_stages.render(results)
    assert "**sum of the medians**" in table
    assert results.to_dict()["median_ns"]["layer 2 (c4a)"]["stepcache"] > 0


def test_import_time_and_the_modules_import_stepcache_loads() -> None:
    results = bench_import.run(processes=2, warmup=0)
    assert len(results.torch_us) == len(results.stepcache_us) == 2
    assert all(us > 0 for us in [*results.torch_us, *results.stepcache_us])
    t = results.stepcache
    assert t.min_ns <= t.median_ns <= t.max_ns
    loaded = results.modules.loaded
    assert "stepcache" in loaded and "torch" not in loaded  # torch came first
    assert results.modules.is_this_checkout
    # the core loads nothing that should load lazily
    lazy = [m for m in loaded if m.split(".")[0] in ("attrs", "attr", "vllm", "pytest")]
    lazy += [m for m in loaded if m.startswith(("stepcache.profiler", "stepcache.int"))]
    lazy += [
        m for m in loaded if m.startswith(("stepcache.pytest", "stepcache_pytest"))
    ]
    assert lazy == [] and results.modules.lazy_loaded == [] and results.lazy_met
    raw = results.to_dict()
    assert raw["command"] == 'python -X importtime -c "import torch; import stepcache"'
    assert raw["lazy_checked"] == list(bench_import.LAZY)
    text = bench_import.render(results)
    assert "`import stepcache` after `import torch`" in text
    assert "loaded of those: none." in text
    assert "median of 2 fresh processes" in bench_import.goal_rows(results)


def test_the_module_check_names_what_loaded_eagerly() -> None:
    check = bench_import.ModuleCheck(
        loaded=["attrs", "json", "stepcache", "stepcache.integrations.vllm", "numpy.x"],
        stepcache_file=str(ROOT / "stepcache" / "__init__.py"),
    )
    assert check.lazy_loaded == ["attrs", "stepcache.integrations.vllm"]
    assert check.outside_stdlib == ["attrs", "stepcache", "stepcache.integrations.vllm"]
    assert check.other_packages == ["attrs"]
    results = bench_import.ImportResults(1, 0, [10], [60_000], check)
    assert not results.time_met and not results.lazy_met
    assert bench_import.goal_rows(results).count("| **no** | issue 19 |") == 2
    assert not bench_import.ModuleCheck(
        ["stepcache"], "/elsewhere/x.py"
    ).is_this_checkout


def test_importtime_top_level_entries() -> None:
    out = (
        "import time: self [us] | cumulative | imported package\n"
        "import time:       100 |        300 |   torch._C\n"
        "import time:       400 |        700 | torch\n"
        "import time:         5 |         55 |     stepcache._envs\n"
        "import time:        50 |         90 | stepcache\n"
    )
    assert bench_import.top_level_us(out) == {"torch": 700, "stepcache": 90}


def test_the_instruction_count_without_expect_turns_the_checks_off() -> None:
    # A fresh process: the patch changes the integrations' functions for its life.
    # There the step stores a sparse-index pair of the wrong dtype, which expect
    # would refuse; a second patch finds nothing left to turn off.
    script = """
import torch
from benchmarks import _cg_step
from stepcache.integrations.dsv4 import sim as dsv4_sim
_cg_step.without_expect()
builders = dsv4_sim.Builders(64)
swa = builders.build_swa(dsv4_sim.make_step([2, 1]), "stepcache")
dsv4_sim.sparse_pair = lambda *args, **kwargs: (torch.zeros(3, 2), torch.zeros(3))
pair = builders.cached_sparse_indices(swa, "swa_only", 0)
print(pair[0].dtype)
try:
    _cg_step.without_expect()
except RuntimeError as exc:
    print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines() == [
        "torch.float32",
        "dsv4.token_to_req_indices has no expect to turn off",
    ]


def test_gpu_request_index_rows_render() -> None:
    timing = {"median_ns": 2e3, "min_ns": 1e3, "max_ns": 3e3}
    rows = [
        {
            "shape": shape,
            "variant": variant,
            "h2d_copies_into_index_buffers": copies,
            "synchronisations": syncs,
            "ns_per_step": timing,
        }
        for shape in bench_cold.SHAPES
        for variant, copies, syncs in (
            ("stepcache", 1, 1),
            ("hand-written", 1, 0),
            ("uncached", 3, 0),
        )
    ]
    text = bench_gpu.render_request_index(rows)
    assert "| six groups | uncached | 3 | 0 | 2.0 | 1.00x |" in text


def test_engine_build_time_gives_each_rounds_total_beside_the_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from benchmarks import bench_engine

    # two rounds a side, a prefill build then two decode builds: the plugin makes
    # the prefill build cheaper and the decode builds dearer
    off, on = [[100, 10, 10], [100, 10, 12]], [[60, 11, 11], [60, 11, 13]]
    prefill = [[True, False, False]] * 2
    run = {
        "build_ns": {"off": off, "on": on},
        "build_prefill": {"off": prefill, "on": prefill},
        "workers": [{"steps": 3, "stats": {}}],
        "timed_workers": None,
    }
    monkeypatch.setattr(bench_engine, "_engine_run", lambda *a, **k: run)
    monkeypatch.setattr(bench_engine, "BUILD_RUNS", (("m", "m", {}, ("",)),))
    monkeypatch.setattr(bench_engine, "RUNNERS", ("v1",))
    (row,) = bench_engine.build_time(processes=1, rounds=2).values()
    (process,) = row["processes"]
    assert process["round_total_ns"] == {"off": [120, 122], "on": [82, 84]}
    assert row["median_on_over_off_total"] == pytest.approx(83 / 121)
    assert row["median_on_over_off_prefill"] == pytest.approx(0.6)
    assert row["median_on_over_off_decode"] == pytest.approx(11 / 10)
    assert row["median_on_over_off"] == pytest.approx(12 / 11)  # between the kinds
