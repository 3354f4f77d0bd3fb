# SPDX-License-Identifier: Apache-2.0
"""The pages' `>>>` examples run as doctests (pyproject: --doctest-glob=*.md).

Each page starts as in a fresh process, as a reader's would: switches off, counters at
zero, no detections recorded, and no entries held, so the stats tables a page prints
are its own. Entries that earlier tests left alive (a module-level owner, the frames of
a failed test) are dropped: their owners would only recompute on the next call.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

import stepcache


def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    # The pages choose their own debug modes and provoke detections on purpose, so
    # stepcache's pytest plugin leaves them alone under --stepcache-debug.
    if not config.pluginmanager.hasplugin("stepcache"):
        return
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.stepcache_debug(mode="off"))


def _drop_leftover_entries() -> None:
    gc.collect()
    for obj in gc.get_objects():
        if type(obj) is stepcache.StepCache:  # type(): no attribute lookups on objects
            obj.clear()


@pytest.fixture(autouse=True)
def _fresh_process_state() -> Iterator[None]:
    stepcache.set_disabled(False)
    stepcache.set_debug("off")
    _drop_leftover_entries()
    stepcache.reset_stats()
    stepcache.clear_debug_report()
    yield
    stepcache.set_disabled(False)
    stepcache.set_debug("off")
    stepcache.clear_debug_report()
