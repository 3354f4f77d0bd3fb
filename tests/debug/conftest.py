# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the debug-mode tests: a test body run in checks or verify mode,
with the process-wide report cleared first; every test runs as written and inside
``torch.inference_mode()``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import stepcache


@pytest.fixture
def checks() -> Iterator[None]:
    stepcache.clear_debug_report()
    with stepcache.debug("checks"):
        yield


@pytest.fixture
def verify() -> Iterator[None]:
    stepcache.clear_debug_report()
    with stepcache.debug("verify"):
        yield


@pytest.fixture(autouse=True)
def _every_step_mode(step_mode: str) -> str:
    return step_mode
