# SPDX-License-Identifier: Apache-2.0
"""How the plugin follows the process-wide debug report: every detection is attributed
to exactly one checkpoint, also when the report is cleared (by the plugin, when it
grows large, or by the code under test between checkpoints)."""

from __future__ import annotations

import dataclasses
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import stepcache
from stepcache import pytest_plugin


@dataclasses.dataclass
class Meta:
    qsl: torch.Tensor


@stepcache.step_cached(owner="m", depends_on=("qsl",))
def total(m: Meta) -> int:
    return int(m.qsl.sum())


def detect() -> stepcache.Detection:
    """One real detection (a dependency changed behind the version counter)."""
    m = Meta(torch.tensor([1, 2]))
    total(m)
    m.qsl.numpy()[0] = 5
    try:
        total(m)
    except stepcache.StaleCacheError:
        return stepcache.debug_report()[-1]
    raise AssertionError("debug mode did not detect the planted change")


@settings(max_examples=50, deadline=None)
@given(
    script=st.lists(st.sampled_from(["detect", "checkpoint", "clear"]), max_size=25),
    clear_at=st.integers(1, 4),
)
def test_each_detection_is_attributed_once(script: list[str], clear_at: int) -> None:
    stepcache.clear_debug_report()
    state = pytest_plugin._Session(mode="checks", stats=False)
    test = pytest_plugin._Test(mode="checks", mode_before="off")
    made: list[stepcache.Detection] = []
    with (
        stepcache.debug("checks"),
        mock.patch.object(pytest_plugin, "_CLEAR_AT", clear_at),
    ):
        for op in script:
            if op == "detect":
                made.append(detect())
            elif op == "checkpoint":
                pytest_plugin._checkpoint(state, test)
            else:  # the code under test clears the report: only after a checkpoint
                pytest_plugin._checkpoint(state, test)
                stepcache.clear_debug_report()
        pytest_plugin._checkpoint(state, test)
    assert [id(d) for d in test.found] == [id(d) for d in made]
    assert len(stepcache.debug_report()) < clear_at or not made
