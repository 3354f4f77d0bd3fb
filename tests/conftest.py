# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: every test starts with stepcache's switches off and counters zero."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import stepcache


@pytest.fixture(autouse=True)
def _clean_switches() -> Iterator[None]:
    stepcache.set_disabled(False)
    stepcache.set_debug("off")
    stepcache.reset_stats()
    yield
    stepcache.set_disabled(False)
    stepcache.set_debug("off")
