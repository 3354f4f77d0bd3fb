# SPDX-License-Identifier: Apache-2.0
"""The examples in the docstrings of stepcache.integrations, run under their installed
name, and of the benchmarks (which pytest's doctest collection does not reach)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import stepcache.integrations

# The benchmarks live in the checkout's top-level folder (they are not installed).
ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODULES = sorted(
    info.name
    for info in pkgutil.iter_modules(
        stepcache.integrations.__path__, "stepcache.integrations."
    )
)
BENCHMARK_MODULES = sorted(
    f"benchmarks.{path.stem}"
    for path in (ROOT / "benchmarks").glob("*.py")
    if path.stem != "__init__"
)


@pytest.mark.parametrize("name", MODULES + BENCHMARK_MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    )
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_every_module_is_found() -> None:
    assert "stepcache.integrations.request_index" in MODULES
    assert "stepcache.integrations.vllm" in MODULES
    assert "benchmarks.bench_floor" in BENCHMARK_MODULES
