# SPDX-License-Identifier: Apache-2.0
"""Smoke tests of the benchmarks' code paths with tiny sizes (no timing assertions)."""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

# The benchmarks live in the checkout's top-level folder (they are not installed).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import (  # noqa: E402
    _pyperf,
    bench_cold,
    bench_dsv4,
    bench_engine,
    bench_gpu,
    bench_hit,
    bench_import,
    bench_soak,
    page,
    run_all,
)
from stepcache.integrations.dsv4 import seed  # noqa: E402

MODULES = [bench_hit, bench_cold, bench_dsv4]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_row_has_its_two_benchmarks(module: Any) -> None:
    for row in module.ROWS:
        assert {row.measured, row.baseline} <= set(module.BENCHES), row.key
        assert " / " in row.label  # it says what both sides do
    assert len({row.key for row in module.ROWS}) == len(module.ROWS)
    names = {n for row in module.ROWS for n in (row.measured, row.baseline)}
    for name in names if module is not bench_dsv4 else []:  # DSv4: below, smaller
        assert module.BENCHES[name]()(3) > 0  # loops -> seconds, as pyperf times it


def test_the_issues_ratios_are_rows() -> None:
    rows = {(m.__name__, r.key): r for m in MODULES for r in m.ROWS}
    for module, key, limit in [
        ("benchmarks.bench_hit", "key/lru_cache", 1.6),
        ("benchmarks.bench_hit", "rix checks/rix", 4.0),
        ("benchmarks.bench_cold", "cold", 1.7),
        ("benchmarks.bench_cold", "cold inference", 2.0),
        ("benchmarks.bench_cold", "cold 1000 alive", 2.0),
        ("benchmarks.bench_cold", "two kinds", 2.0),
        ("benchmarks.bench_cold", "scope 6x3", 3.0),
        ("benchmarks.bench_cold", "rix three consumers", 1.0),
    ]:
        assert rows[module, key].limit == limit
    for key in ("rix three consumers inference", "rix inference/seed"):
        assert any(k == key for _, k in rows)
    assert rows["benchmarks.bench_hit", "disabled/plain"].baseline == "plain"


def test_a_module_runs_under_pyperf_and_compares_with_compare_to(
    tmp_path: Path,
) -> None:
    # two processes of two values each, fixed loops: what the results file gets
    options = ("-p", "2", "-n", "2", "-w", "0", "--loops", "50")
    results = _pyperf.run_module(
        "benchmarks.bench_hit", tmp_path / "hit.json", (*options, "--rows", "lru")
    )
    (row,) = results["rows"]
    assert (row["key"], row["limit"], row["set_by"]) == (
        "key/lru_cache",
        1.6,
        "issue 56",
    )
    assert row["ratio"] > 0 and isinstance(row["met"], bool)
    # pyperf compare_to's verdict on two samples of 4 values each (its t-score where
    # it finds the difference significant)
    assert isinstance(row["significant"], bool)
    assert (row["t_score"] is not None) == row["significant"]
    assert row["compare_to"].startswith("Mean +- std dev: [baseline]")
    assert list(results["benchmarks"]) == ["key", "lru_cache"]
    assert all(
        (s["processes"], s["values"]) == (2, 4) for s in results["benchmarks"].values()
    )
    assert results["machine"]["cpu_count"] and results["machine"]["torch"]
    assert results["command"].startswith("python -m benchmarks.bench_hit --quiet")
    assert set(results["source"]) >= {"commit", "dirty", "dirty_paths"}
    assert results["does"]["key"] == bench_hit.DOES["key"]


def test_run_all_writes_the_results_and_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = "--debug-single-value"
    tiny: dict[str, Any] = {
        "hit": (one, "--rows", "in checks mode / in production"),
        "cold": (one, "--rows", "six owners"),
        "dsv4": (one, "--rows", "(8 layers, 1 tokens): uncached"),
        "soak": {"steps": 20, "warmup": 2},
        "imports": {"processes": 1, "warmup": 0},
    }
    monkeypatch.setattr(run_all, "QUICK", tiny)
    assert run_all.main(["--quick", "--out", str(tmp_path)]) == 0
    raw = json.loads((tmp_path / "benchmarks" / "results.json").read_text())
    assert raw["command"] == f"python -m benchmarks.run_all --quick --out {tmp_path}"
    assert [r["key"] for r in raw["cold"]["rows"]] == ["scope 6x3"]
    assert raw["cold"]["work_per_step"]["three consumers"]["uncached"] == 3
    assert raw["dsv4"]["work_per_step"]["61 layers, 1 tokens"]["stepcache"] == [1, 32]
    assert raw["soak"]["max_live_entries_after_step"] == 0
    assert raw["imports"]["lazy_loaded"] == []
    # the copies of both pages, their blocks from this run
    readme = (tmp_path / "README.md").read_text()
    data = page.load(results=tmp_path / "benchmarks" / "results.json")
    assert page.readme_block(raw, data["engine"]) in readme
    assert "rix checks/rix" not in readme and "| key checks" not in readme
    assert "stepcache in checks mode" in (tmp_path / "benchmarks.md").read_text()


def test_the_request_index_rows_count_copies_and_agree() -> None:
    # counted, not timed: copies into the three consumers' buffers per step
    assert bench_cold.work_per_step()["work_per_step"] == {
        "three consumers": {"stepcache": 1, "hand-written": 1, "uncached": 3},
        "six groups": {"stepcache": 1, "hand-written": 1, "uncached": 6},
    }
    layout = bench_cold.Layout(inference=True)
    assert (
        layout.query_start_loc.is_inference() and not layout.buffers[0].is_inference()
    )
    step = bench_cold.three_consumers("stepcache")
    assert [r.tolist() for r in step(layout)] == [
        r.tolist() for r in bench_cold.three_consumers("uncached")(layout)
    ]


def test_the_dsv4_variants_agree_and_time() -> None:
    assert bench_dsv4.batch_layout(1) == [1]
    lens = bench_dsv4.batch_layout(4096)
    assert sum(lens) == 4096 and lens.count(1) == 256 and max(lens) == 1024
    assert bench_dsv4._step(3, 2, "stepcache")()(2) > 0


def test_the_kept_slice_cache_returns_its_first_slice() -> None:
    qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    stock = seed.SeedMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    kept = bench_hit.KeptSliceMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    first = kept.token_to_req_indices(torch.zeros(8, dtype=torch.int32))
    assert (
        first.tolist()
        == stock.token_to_req_indices(torch.zeros(8, dtype=torch.int32)).tolist()
    )
    # a hit hands back the very tensor, where the seed's makes a new slice each time
    assert kept.token_to_req_indices(torch.zeros(8, dtype=torch.int32)) is first
    buffer = torch.zeros(8, dtype=torch.int32)
    assert stock.token_to_req_indices(buffer) is not stock.token_to_req_indices(buffer)


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
    # "stock vLLM's method" on the benchmarks page: the seed's hit branch is vLLM's;
    # skipped without vLLM, unless the test command requires it
    if os.environ.get("STEPCACHE_REQUIRE_VLLM") == "1":
        backend = importlib.import_module("vllm.v1.attention.backend")
    else:
        backend = pytest.importorskip("vllm.v1.attention.backend")
    stock = inspect.getsource(backend.CommonAttentionMetadata.token_to_req_indices)
    ours = inspect.getsource(seed.handwritten_token_to_req_indices)
    assert _hit_branch(ours) == _hit_branch(stock)
    assert _hit_branch(ours).count("assert ") == 3


def test_the_soak_counts_only_the_entries_of_stores_made_after_it_began() -> None:
    from stepcache._store import live_caches

    results = bench_soak.soak(steps=40, warmup=4)
    assert results["max_live_entries_during_step"] >= 1
    assert results["max_live_entries_after_step"] == 0
    assert len(results["segment_growth_bytes"]) == bench_soak.SEGMENTS

    def build() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)

    class SWA:
        pass

    # an owner that outlives the soak (a parametrized test's, say) is not its leak
    older = SWA()
    bench_soak.sparse_index.sparse_index(older, "c128a", None, build)
    before = frozenset(id(store) for store in live_caches())
    assert bench_soak.live_entries() >= 1 and bench_soak.live_entries(before) == 0
    newer = SWA()
    for kind in ("c128a", "swa_only", "c4a"):  # a C4A layer is never cached
        bench_soak.sparse_index.sparse_index(newer, kind, None, build)
    assert bench_soak.live_entries(before) == 2
    del newer
    assert bench_soak.live_entries(before) == 0 and older is not None


def test_import_time_and_what_import_stepcache_loads() -> None:
    results = bench_import.run(processes=2, warmup=0)
    assert len(results["stepcache_us"]) == 2 and all(results["stepcache_us"])
    loaded = results["modules_loaded"]
    assert "stepcache" in loaded and "torch" not in loaded  # torch came first
    assert results["lazy_loaded"] == [] and "vllm" in results["lazy_checked"]
    assert bench_import.is_lazy("stepcache.integrations.vllm")
    assert not bench_import.is_lazy("stepcache._store")


def test_the_source_state_names_a_runs_own_results_file() -> None:
    if _pyperf.source_state()["commit"] is None:
        pytest.skip("not a git checkout, or no git here")
    results = ROOT / "benchmarks" / "own-results-check.json"
    results.write_text("{}\n")  # a section an earlier run just wrote: untracked
    try:
        assert (
            "benchmarks/own-results-check.json" in _pyperf.source_state()["dirty_paths"]
        )
        state = _pyperf.source_state(own=results)
        assert state["own_results_uncommitted"] == "benchmarks/own-results-check.json"
        assert "benchmarks/own-results-check.json" not in state["dirty_paths"]
    finally:
        results.unlink()


def test_the_gpu_measurement_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU code path with CPU tensors: synchronisation and the profiler stubbed."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_gpu, "_profile", lambda fn: (fn(), (7, 6, 1))[1])
    monkeypatch.setattr(bench_gpu, "count_syncs", lambda fn: (fn(), 0)[1])
    cpu = torch.device("cpu")
    rows = bench_gpu.dsv4_step(4, 3, cpu, steps=1, repeats=1)
    rows += bench_gpu.request_index(cpu, steps=1, repeats=1)
    assert [r["variant"] for r in rows[:3]] == ["uncached", "hand-written", "stepcache"]
    assert all(r["h2d_copies"] == 0 and r["cuda_kernels"] == 6 for r in rows)  # CPU
    assert {r["what"] for r in rows[3:]} == {
        f"request index, {s}" for s in bench_cold.SHAPES
    }


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


def test_engine_build_time_gives_each_rounds_total_beside_the_medians(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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


def test_the_per_call_section_is_a_list_of_rows_each_with_both_sides() -> None:
    names = [name for name, _ in bench_engine.PER_CALL]
    assert [r.key for r in bench_engine.PER_CALL_ROWS] == names
    for row in bench_engine.PER_CALL_ROWS:
        assert {row.measured, row.baseline} <= set(bench_engine.PER_CALL_BENCHES)
        assert row.measured.endswith("[plugin]") and row.baseline.endswith("[stock]")
