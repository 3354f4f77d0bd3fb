# SPDX-License-Identifier: Apache-2.0
"""Fixtures shared by the debug-mode tests: a test body run in checks or verify mode,
with the process-wide report cleared first."""

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
