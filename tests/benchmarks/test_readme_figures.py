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

from benchmarks import _readme, _seed, _timing, bench_hit  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "results.json"
PAGES = [(ROOT / "README.md", "docs/"), (ROOT / "docs" / "index.md", "")]


def _committed_results() -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(RESULTS.read_text())
    return raw


@pytest.mark.parametrize(("page", "docs"), PAGES, ids=["README.md", "docs/index.md"])
def test_the_pages_figures_are_generated_from_results_json(
    page: Path, docs: str
) -> None:
    engine = (ROOT / "docs" / _readme.ENGINE_RESULTS).exists()
    expected = _readme.block(_committed_results(), docs, engine=engine)
    assert _readme.current_block(page.read_text()) == expected, (
        f"{page.name}'s figures differ from {RESULTS.relative_to(ROOT)}: run "
        "`python -m benchmarks.run_all` (it rewrites both), never edit them by hand"
    )


def _full_results() -> dict[str, Any]:
    """results.json as a run of this code writes it (every row, made-up numbers)."""
    labels = [c.label for c in bench_hit.cases(10)]
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
                {"measured": m, "baseline": b, "ratio": 12.25}
                for m, b in bench_hit.COMPARISONS
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
    text = _readme.block(raw, "docs/", engine=False)
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
    assert "[engine results](docs/benchmarks/engine.json)" in _readme.block(
        raw, "docs/", engine=True
    )


def test_a_row_the_results_lack_reads_not_measured_yet() -> None:
    raw = _full_results()
    del raw["hit"]["ns_per_call"][bench_hit.RIX_KEPT]
    raw["hit"]["comparisons"] = []
    raw["source"] = {"commit": None, "dirty": None, "dirty_paths": []}
    text = _readme.block(raw, "", engine=False)
    assert "returns it, checks nothing | not measured yet |" in text
    assert (
        "| a call in disabled mode / the undecorated method | not measured yet |"
        in text
    )
    assert "at a commit the run did not record" in text


def test_a_dirty_tree_is_said() -> None:
    raw = _full_results()
    raw["source"] = {"commit": "f" * 40, "dirty": True, "dirty_paths": ["a.py", "b"]}
    assert "with uncommitted changes in 2 path(s)" in _readme.block(
        raw, "", engine=False
    )


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


def test_the_machine_is_described() -> None:
    info = _timing.machine()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cores"], int) and info["cores"] >= 1
    assert info["cpu"] and info["python"].split()[0] == sys.version.split()[0]


def test_the_kept_slice_cache_returns_its_first_slice() -> None:
    qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    seed = _seed.SeedMetadata(qsl, qsl.clone(), num_actual_tokens=7)
    kept = _seed.KeptSliceMetadata(qsl, qsl.clone(), num_actual_tokens=7)
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
    # skipped without vLLM, unless the test command requires it (as for tests/vllm)
    if os.environ.get("STEPCACHE_REQUIRE_VLLM") == "1":
        backend = importlib.import_module("vllm.v1.attention.backend")
    else:
        backend = pytest.importorskip("vllm.v1.attention.backend")
    stock = inspect.getsource(backend.CommonAttentionMetadata.token_to_req_indices)
    ours = inspect.getsource(_seed.seed_token_to_req_indices)
    assert _hit_branch(ours) == _hit_branch(stock)
    assert _hit_branch(ours).count("assert ") == 3
