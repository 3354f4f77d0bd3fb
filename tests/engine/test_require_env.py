# SPDX-License-Identifier: Apache-2.0
"""``STEPCACHE_REQUIRE_VLLM=1`` turns the skip of a tests/vllm or tests/engine test
into a failure: the hooks of both conftests, run on a small suite by pytester."""

from __future__ import annotations

import inspect
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


def _hook_source(conftest: Path) -> str:
    """The conftest's ``pytest_runtest_makereport`` hook, with what it needs."""
    source = conftest.read_text()
    start = source.index("@pytest.hookimpl(hookwrapper=True)")
    end = source.index("\n\n\n", start)
    env = "REQUIRE_ENV = 'STEPCACHE_REQUIRE_VLLM'\n"
    return (
        "import os\nfrom typing import Any\nimport pytest\n" + env + source[start:end]
    )


SUITE = textwrap.dedent(
    """
    import pytest

    def test_skipped():
        pytest.importorskip("a_module_that_is_not_installed")

    def test_passes():
        assert True
    """
)


@pytest.mark.parametrize("folder", ["vllm", "engine"])
@pytest.mark.parametrize("required", [False, True])
def test_a_skip_fails_only_when_required(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    folder: str,
    required: bool,
) -> None:
    pytester.makeconftest(_hook_source(HERE.parent / folder / "conftest.py"))
    pytester.makepyfile(test_suite=SUITE)
    if required:
        monkeypatch.setenv("STEPCACHE_REQUIRE_VLLM", "1")
    else:
        monkeypatch.delenv("STEPCACHE_REQUIRE_VLLM", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    if required:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(
            ["*STEPCACHE_REQUIRE_VLLM=1 and this * test was skipped*"]
        )
    else:
        result.assert_outcomes(passed=1, skipped=1)


def test_the_hooks_are_in_both_conftests() -> None:
    for folder in ("vllm", "engine"):
        assert "def pytest_runtest_makereport" in inspect.cleandoc(
            (HERE.parent / folder / "conftest.py").read_text()
        )
