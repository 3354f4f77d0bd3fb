# SPDX-License-Identifier: Apache-2.0
"""vLLM builders decorated by the plugin give what vLLM's own functions give, for
any layout and any sequence of changes to it, and compute once per layout; what the
plugin leaves alone stays vLLM's."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepcache.integrations.vllm import dsv4 as _vllm_dsv4

pytestmark = pytest.mark.vllm

Metadata = Any


layouts = st.lists(st.integers(0, 6), min_size=1, max_size=7)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    query_lens=layouts,
    context=st.integers(0, 300),
    more_context=st.integers(1, 200),
)
def test_c128_boundary_equals_vllms_and_follows_the_layout(
    plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    query_lens: list[int],
    context: int,
    more_context: int,
) -> None:
    from vllm.models.deepseek_v4 import compressor

    original = _vllm_dsv4._original["c128_boundary"]
    cam = make_metadata(query_lens, context=context)
    assert compressor._get_c128_boundary(cam) == original(cam)
    assert compressor._get_c128_boundary(cam) == original(cam)
    cam.seq_lens_cpu_upper_bound = cam.seq_lens_cpu_upper_bound + more_context
    assert compressor._get_c128_boundary(cam) == original(cam)
    cam.seq_lens_cpu_upper_bound = None
    assert compressor._get_c128_boundary(cam) is None


def test_c128_boundary_follows_the_draft_loops_in_place_step(
    plugin_on: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """vLLM's unpadded draft loop adds 1 in place to ``seq_lens_cpu_upper_bound``, a
    tensor it made in the step (an inference tensor: no version counter)."""
    import torch
    from vllm.models.deepseek_v4 import compressor

    original = _vllm_dsv4._original["c128_boundary"]
    with torch.inference_mode():
        cam = make_metadata([1, 1], context=0)
        cam.query_start_loc_cpu = torch.tensor([0, 1, 2], dtype=torch.int32)
        cam.seq_lens_cpu_upper_bound = torch.tensor([127, 127], dtype=torch.int32) - 0
        answers = []
        for _ in range(3):  # starts 126, 127, 128: the second crosses a c128 boundary
            answers.append(compressor._get_c128_boundary(cam))
            assert answers[-1] == original(cam)
            cam.seq_lens_cpu_upper_bound += 1
    assert answers == [False, True, False]


def test_c128_boundary_is_computed_once_per_layout(
    plugin_on: ModuleType,
    make_metadata: Callable[..., Metadata],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.models.deepseek_v4 import compressor

    calls: list[int] = []
    original = _vllm_dsv4._original["c128_boundary"]

    def counting(metadata: Metadata) -> bool | None:
        calls.append(1)
        result: bool | None = original(metadata)
        return result

    monkeypatch.setitem(_vllm_dsv4._original, "c128_boundary", counting)
    cam = make_metadata([100, 40], context=60)
    answers = {compressor._get_c128_boundary(cam) for _ in range(3)}
    assert answers == {True} and calls == [1]


def test_a_c128_boundary_that_differs_from_stock_raises_in_verify_mode(
    verify_plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.models.deepseek_v4 import compressor

    import stepcache

    cam = make_metadata([100, 40], context=60)
    assert compressor._get_c128_boundary(cam) is True
    # stock vLLM now says otherwise: the cached value is stale
    monkeypatch.setitem(_vllm_dsv4._original, "c128_boundary", lambda m: False)
    with pytest.raises(stepcache.StaleCacheError) as caught:
        compressor._get_c128_boundary(cam)
    message = str(caught.value)
    assert "vllm.dsv4._get_c128_boundary" in message
    assert "'result': expected False, actual True" in message
