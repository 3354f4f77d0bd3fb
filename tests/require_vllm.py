# SPDX-License-Identifier: Apache-2.0
"""``STEPCACHE_REQUIRE_VLLM=1`` (the test command sets it): a skipped test of the
folders whose conftest installs `skip_fails` fails instead, so a broken vLLM install
cannot pass as a skip."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

REQUIRE_ENV = "STEPCACHE_REQUIRE_VLLM"


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
        # a test the machine cannot run (no AMX) skips; a missing install does not
        hardware = str(reason).startswith("Skipped: hardware:")
        if report.skipped and os.environ.get(REQUIRE_ENV) == "1" and not hardware:
            report.outcome = "failed"
            report.longrepr = (
                f"{REQUIRE_ENV}=1 and this {what} test was skipped: {reason} {hint}"
            )

    return pytest_runtest_makereport
