# SPDX-License-Identifier: Apache-2.0
"""Whether the real vLLM is here, and ``STEPCACHE_REQUIRE_VLLM=1``.

:func:`vllm_problem` and :func:`vllm_or_skip` tell the real vLLM from what can stand
in for it on ``sys.path``: a folder named ``vllm`` (this repository's tests once had
one) imports as an empty namespace package, so ``pytest.importorskip("vllm")`` passes
and the test then fails on ``vllm.v1``. Both require a ``vllm`` package with an
``__init__.py`` and a ``vllm.v1``; anything else skips, with the reason.

``STEPCACHE_REQUIRE_VLLM=1`` (the test command sets it): a skipped test of the folders
whose conftest installs :func:`skip_fails` fails instead, so a broken vLLM install
cannot pass as a skip."""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REQUIRE_ENV = "STEPCACHE_REQUIRE_VLLM"


def vllm_problem() -> str | None:
    """Why ``import vllm`` would not give the real vLLM here, or None if it would.

    Looks at the import system only and imports nothing: a conftest can ask before
    vLLM is imported (tests/vllm_plugin must switch Triton's interpreter on first)."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError) as exc:  # a broken entry in sys.modules
        return f"vLLM cannot be found: {type(exc).__name__}: {exc}"
    if spec is None:
        return "vLLM is not installed"
    folders = list(spec.submodule_search_locations or ())
    if spec.origin is None or not spec.has_location:
        return (
            f"'vllm' resolves to a namespace package ({', '.join(folders)}), not to "
            "vLLM: a folder named vllm on sys.path shadows it, and vLLM is not "
            "installed"
        )
    if not any((Path(folder) / "v1").is_dir() for folder in folders):
        return f"'vllm' at {spec.origin} has no vllm.v1: not vLLM 0.33"
    return None


def vllm_or_skip() -> ModuleType:
    """vLLM itself, imported; skips the test, saying why, when :func:`vllm_problem`
    finds none or ``vllm`` or ``vllm.v1`` does not import."""
    problem = vllm_problem()
    if problem is not None:
        pytest.skip(problem)
    try:
        vllm = importlib.import_module("vllm")
        importlib.import_module("vllm.v1")
    except ImportError as exc:
        pytest.skip(f"vLLM is installed but does not import: {exc!r}")
    if getattr(vllm, "__file__", None) is None:  # no __init__.py: not vLLM
        pytest.skip(f"'vllm' is a namespace package, not vLLM: {vllm!r}")
    return vllm


def skip_fails(what: str, hint: str) -> Callable[..., Any]:
    """The ``pytest_runtest_makereport`` hook for a conftest: under
    ``STEPCACHE_REQUIRE_VLLM=1`` a skipped ``what`` test fails, saying ``hint``."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Any:
        outcome = yield
        report = outcome.get_result()
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else ""
        # a test the machine cannot run (no AMX) or the installed release has no
        # target for (the test command runs it on the release that has) skips; a
        # missing install does not
        allowed = str(reason).startswith(("Skipped: hardware:", "Skipped: release:"))
        if report.skipped and os.environ.get(REQUIRE_ENV) == "1" and not allowed:
            report.outcome = "failed"
            report.longrepr = (
                f"{REQUIRE_ENV}=1 and this {what} test was skipped: {reason} {hint}"
            )

    return pytest_runtest_makereport
