# SPDX-License-Identifier: Apache-2.0
"""vLLM builders decorated by the plugin give what vLLM's own functions give, for
any layout and any sequence of changes to it, and compute once per layout."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stepcache
from stepcache.integrations import _vllm_dsv4, _vllm_split

pytestmark = pytest.mark.vllm

Metadata = Any


def _split_modules() -> list[str]:
    return sorted(
        name
        for name, m in list(sys.modules.items())
        if name.startswith("vllm.")
        and isinstance(m, ModuleType)
        and "split_decodes_and_prefills" in vars(m)
    )


def test_every_importer_of_split_decodes_and_prefills_gets_the_decorated_one(
    plugin: ModuleType,
) -> None:
    modules = _split_modules()
    # the DSv4 builders and the attention utils at least
    assert {
        "vllm.v1.attention.backends.utils",
        "vllm.v1.attention.backends.mla.sparse_swa",
        "vllm.models.deepseek_v4.compressor",
        "vllm.models.deepseek_v4.sparse_mla",
    } <= set(modules)
    for name in modules:
        bound = sys.modules[name].split_decodes_and_prefills
        assert bound is _vllm_split.split_decodes_and_prefills, name
    plugin.unregister()
    original = _vllm_split._original["split"]
    for name in modules:
        assert sys.modules[name].split_decodes_and_prefills is original, name


layouts = st.lists(st.integers(0, 6), min_size=1, max_size=7)
params = st.tuples(st.integers(1, 4), st.booleans(), st.booleans())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    query_lens=layouts,
    pad=st.integers(0, 3),
    calls=st.lists(st.tuples(params, st.booleans()), min_size=1, max_size=6),
    data=st.data(),
)
def test_split_decodes_and_prefills_equals_vllms(
    plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    query_lens: list[int],
    pad: int,
    calls: list[tuple[tuple[int, bool, bool], bool]],
    data: st.DataObject,
) -> None:
    """A sequence of calls with any parameters; between two calls the layout may be
    reassigned on the same object (the draft loop), as a different layout."""
    from vllm.v1.attention.backends.utils import split_decodes_and_prefills

    original = _vllm_split._original["split"]
    cam = make_metadata(query_lens, pad_to=sum(query_lens) + pad)
    n = len(query_lens)
    flags = data.draw(st.lists(st.booleans(), min_size=n, max_size=n))
    cam.is_prefilling = torch.tensor(flags, dtype=torch.bool)
    for (threshold, uniform, short_as_decodes), reassign in calls:
        if reassign:
            lens = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n))
            qsl = torch.zeros(n + 1, dtype=torch.int32)
            qsl[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
            cam.query_start_loc, cam.query_start_loc_cpu = qsl, qsl.clone()
            cam.num_actual_tokens = int(qsl[-1])
            cam.max_query_len = max(lens)
        args = (threshold, uniform, short_as_decodes)
        assert split_decodes_and_prefills(cam, *args) == original(cam, *args)
        assert split_decodes_and_prefills(
            cam,
            decode_threshold=threshold,
            require_uniform=uniform,
            treat_short_extends_as_decodes=short_as_decodes,
        ) == original(cam, *args)


def test_split_is_computed_once_per_layout_and_parameters(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    from vllm.models.deepseek_v4 import compressor
    from vllm.v1.attention.backends.mla import sparse_swa

    cam = make_metadata([1, 1, 3])
    results = {
        sparse_swa.split_decodes_and_prefills(cam, decode_threshold=1),
        compressor.split_decodes_and_prefills(cam, decode_threshold=1),
        sparse_swa.split_decodes_and_prefills(cam, 1),
    }
    assert len(results) == 1
    sparse_swa.split_decodes_and_prefills(cam, decode_threshold=3)
    counts = stepcache.cache_of(cam).stats()["vllm.split_decodes_and_prefills"]
    assert counts["misses"] == 2  # one per decode_threshold
    cam.query_start_loc_cpu[1:] += 1  # an in-place change of the layout
    cam.query_start_loc[1:] += 1
    cam.num_actual_tokens += 3
    assert sparse_swa.split_decodes_and_prefills(cam, 1) == _vllm_split._original[
        "split"
    ](cam, 1)
    assert (
        stepcache.cache_of(cam).stats()["vllm.split_decodes_and_prefills"]["misses"]
        == 3
    )


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


def test_c128_boundary_is_computed_once_per_layout(
    plugin: ModuleType,
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
