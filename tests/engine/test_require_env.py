# SPDX-License-Identifier: Apache-2.0
"""``STEPCACHE_REQUIRE_VLLM=1`` turns the skip of a tests/vllm_plugin or tests/engine
test into a failure: the hook both conftests install (``tests/require_vllm.py``), run
on a small suite by pytester."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


def _conftest(folder: str) -> str:
    """A conftest with the hook of ``folder``'s conftest."""
    what = {"vllm_plugin": "vLLM", "engine": "engine"}[folder]
    return (
        "from require_vllm import skip_fails\n"
        f"pytest_runtest_makereport = skip_fails({what!r}, '')\n"
    )


SUITE = textwrap.dedent(
    """
    import pytest

    def test_skipped():
        pytest.importorskip("a_module_that_is_not_installed")

    def test_skipped_by_the_vllm_helper(monkeypatch):
        import require_vllm

        monkeypatch.setattr(require_vllm, "vllm_problem", lambda: "no vLLM here")
        require_vllm.vllm_or_skip()

    def test_passes():
        assert True

    @pytest.mark.skipif(True, reason="hardware: this CPU lacks a feature")
    def test_needs_other_hardware():
        pass
    """
)


@pytest.mark.parametrize("folder", ["vllm_plugin", "engine"])
@pytest.mark.parametrize("required", [False, True])
def test_a_skip_fails_only_when_required(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    folder: str,
    required: bool,
) -> None:
    pytester.makeconftest(_conftest(folder))
    monkeypatch.setenv("PYTHONPATH", str(HERE.parent))  # tests/: require_vllm
    pytester.makepyfile(test_suite=SUITE)
    if required:
        monkeypatch.setenv("STEPCACHE_REQUIRE_VLLM", "1")
    else:
        monkeypatch.delenv("STEPCACHE_REQUIRE_VLLM", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    if required:  # a machine without the hardware still skips
        result.assert_outcomes(passed=1, failed=2, skipped=1)
        result.stdout.fnmatch_lines(
            ["*STEPCACHE_REQUIRE_VLLM=1 and this * test was skipped*"]
        )
    else:
        result.assert_outcomes(passed=1, skipped=3)
        result.stdout.fnmatch_lines(["*SKIPPED*no vLLM here*"])


def test_the_hooks_are_in_both_conftests() -> None:
    for folder in ("vllm_plugin", "engine"):
        text = (HERE.parent / folder / "conftest.py").read_text()
        assert "pytest_runtest_makereport = skip_fails(" in text
