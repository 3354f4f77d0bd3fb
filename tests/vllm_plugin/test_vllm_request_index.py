# SPDX-License-Identifier: Apache-2.0
"""The request index on vLLM 0.33's real ``CommonAttentionMetadata``: the stale rows
of stock vLLM's hand-written cache, fixed by the plugin; same rows as vLLM's kernel;
one computation per step shared by the DSv4 builders and the KV-cache groups."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from releases import needs_module

import stepcache
from stepcache.integrations.vllm import metadata as _vllm_metadata

pytestmark = pytest.mark.vllm

Metadata = Any  # vllm.v1.attention.backend.CommonAttentionMetadata


def reference(query_lens: list[int], rows: int) -> list[int]:
    out = [i for i, n in enumerate(query_lens) for _ in range(n)]
    return out + [0] * (rows - len(out))


# -- how an object ends up with another layout than the one its index was built for --
def one_token_each(cam: Metadata) -> tuple[torch.Tensor, torch.Tensor, int]:
    n = cam.num_reqs
    qsl = torch.arange(n + 1, dtype=torch.int32)
    return qsl, torch.from_numpy(np.arange(n + 1, dtype=np.int32)).clone(), n


def via_replace_method(cam: Metadata) -> Metadata:
    qsl, qsl_cpu, n = one_token_each(cam)
    return cam.replace(
        query_start_loc=qsl, query_start_loc_cpu=qsl_cpu, num_actual_tokens=n
    )


def via_dataclasses_replace(cam: Metadata) -> Metadata:
    qsl, qsl_cpu, n = one_token_each(cam)
    return dataclasses.replace(
        cam, query_start_loc=qsl, query_start_loc_cpu=qsl_cpu, num_actual_tokens=n
    )


def via_copy(cam: Metadata) -> Metadata:
    other = copy.copy(cam)
    other.query_start_loc, other.query_start_loc_cpu, other.num_actual_tokens = (
        one_token_each(cam)
    )
    return other


def via_draft_loop(cam: Metadata) -> Metadata:
    # vllm/v1/spec_decode/llm_base_proposer.py, before the draft loop: the same object
    # gets one token per request
    cam.num_actual_tokens = cam.num_reqs
    cam.max_query_len = 1
    cam.query_start_loc, cam.query_start_loc_cpu, _ = one_token_each(cam)
    return cam


SCENARIOS = [via_replace_method, via_dataclasses_replace, via_copy, via_draft_loop]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_stock_vllm_returns_the_earlier_layouts_rows(
    stock: None,
    stock_kernel: None,
    make_metadata: Callable[..., Metadata],
    scenario: Callable[[Metadata], Metadata],
) -> None:
    """The bug, on stock vLLM (its Triton kernel runs in Triton's interpreter)."""
    cam = make_metadata([3, 2, 2])
    buffer = torch.zeros(32, dtype=torch.int32)
    assert cam.token_to_req_indices(buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    other = scenario(cam)
    rows = other.token_to_req_indices(torch.zeros(32, dtype=torch.int32)).tolist()
    assert rows == [0, 0, 0]  # the first rows of the earlier layout
    assert rows != [0, 1, 2]  # what this layout maps to


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_plugin_recomputes_for_the_new_layout(
    plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    scenario: Callable[[Metadata], Metadata],
    count_index_computations: list[int],
) -> None:
    cam = make_metadata([3, 2, 2])
    buffer = torch.zeros(32, dtype=torch.int32)
    first = cam.token_to_req_indices(buffer)
    assert first.tolist() == [0, 0, 0, 1, 1, 2, 2]
    other = scenario(cam)
    other_buffer = torch.zeros(32, dtype=torch.int32)
    assert other.token_to_req_indices(other_buffer).tolist() == [0, 1, 2]
    assert count_index_computations == [1, 1]
    if other is not cam:
        # The original still gets its own rows, without a computation. (A copy.copy
        # shares the original's store, whose one entry for this function is now the
        # copy's: the original finds its rows again through its own field.)
        again = cam.token_to_req_indices(buffer)
        assert again.tolist() == [0, 0, 0, 1, 1, 2, 2]
        assert again.data_ptr() == first.data_ptr()
        assert count_index_computations == [1, 1]


def test_an_index_whose_buffer_another_layout_wrote_is_recomputed(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """Two layouts of one step into one persistent buffer: the first object's index,
    kept in its own field, is not handed out once the second wrote the rows."""
    first, second = make_metadata([3, 2, 2]), make_metadata([1, 1, 1, 1])
    buffer = torch.zeros(32, dtype=torch.int32)
    assert first.token_to_req_indices(buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert second.token_to_req_indices(buffer).tolist() == [0, 1, 2, 3]
    assert first.token_to_req_indices(buffer).tolist() == [0, 0, 0, 1, 1, 2, 2]


@needs_module("vllm.v1.spec_decode.utils")
def test_extend_all_queries_by_n_gets_its_own_rows(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """vLLM's parallel drafting extends every query with replace(): a real caller."""
    from vllm.v1.spec_decode.utils import extend_all_queries_by_N

    cam = make_metadata([2, 1])
    cam.token_to_req_indices(torch.zeros(32, dtype=torch.int32))
    extended = extend_all_queries_by_N(
        cam, 2, torch.arange(8, dtype=torch.int32), torch.arange(7)
    )
    rows = extended.token_to_req_indices(torch.zeros(32, dtype=torch.int32))
    assert rows.tolist() == [0, 0, 0, 0, 1, 1, 1]


layouts = st.lists(st.integers(0, 5), max_size=7)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query_lens=layouts, pad=st.integers(0, 4), spare=st.integers(0, 3))
def test_the_numpy_path_gives_the_rows_of_vllms_kernel(
    plugin: ModuleType,
    stock_kernel: None,
    make_metadata: Callable[..., Metadata],
    query_lens: list[int],
    pad: int,
    spare: int,
) -> None:
    from vllm.v1.attention.ops.metadata import compute_token_to_req_indices

    rows = sum(query_lens) + pad
    cam = make_metadata(query_lens, pad_to=rows)
    kernel_buffer = torch.full((rows + spare,), -3, dtype=torch.int32)
    expected = compute_token_to_req_indices(
        cam.query_start_loc, kernel_buffer, sum(query_lens), rows
    )
    ours_buffer = torch.full((rows + spare,), -3, dtype=torch.int32)
    ours = cam.token_to_req_indices(ours_buffer)
    assert ours.tolist() == expected.tolist() == reference(query_lens, rows)
    assert torch.equal(ours_buffer, kernel_buffer)  # the same rows written, no more


@pytest.fixture
def count_index_computations(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    calls: list[int] = []
    original = _vllm_metadata.request_index_array

    def counting(*args: Any, **kwargs: Any) -> np.ndarray:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(_vllm_metadata, "request_index_array", counting)
    yield calls


def _compressor_builder(buffer: torch.Tensor) -> Any:
    from types import SimpleNamespace

    from vllm.models.deepseek_v4.compressor import CompressorMetadataBuilder

    builder = object.__new__(CompressorMetadataBuilder)
    builder.token_to_req_indices = buffer
    builder.block_size = 8  # 8: the builder also computes _get_c128_boundary
    builder.vllm_config = SimpleNamespace(
        scheduler_config=SimpleNamespace(async_scheduling=False),
        speculative_config=None,
    )
    return builder


def _sparse_mla_builder(buffer: torch.Tensor) -> Any:
    from types import SimpleNamespace

    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4SparseMLAMetadataBuilder

    builder = object.__new__(DeepseekV4SparseMLAMetadataBuilder)
    builder.req_id_per_token_buffer = buffer
    builder.compress_ratio = 4
    builder.kv_cache_spec = SimpleNamespace(num_states=16, block_size=64)
    builder.compressed_slot_mapping_buffer = torch.empty(64, dtype=torch.int64)
    builder.topk_tokens = 4
    return builder


def test_the_three_dsv4_builders_share_one_computation(
    plugin: ModuleType,
    stock_kernel: None,
    make_metadata: Callable[..., Metadata],
    count_index_computations: list[int],
) -> None:
    """vLLM's own sparse-MLA and compressor builders (built without their engine, with
    the attributes ``build`` reads; the sparse-MLA one runs vLLM's slot-mapping
    kernel in Triton's interpreter), and the sparse-SWA builder's call (its ``build``
    needs FlashMLA's scheduler, which does not run on a CPU: the test makes the call
    it makes, with a buffer of its own)."""
    cam = make_metadata([4, 0, 1, 3], pad_to=10)
    mla_buffer, compressor_buffer, swa_buffer = (
        torch.zeros(64, dtype=torch.int32) for _ in range(3)
    )
    mla = _sparse_mla_builder(mla_buffer).build(0, cam)
    compressor = _compressor_builder(compressor_buffer).build(0, cam)
    swa = cam.token_to_req_indices(swa_buffer)
    assert count_index_computations == [1]
    assert mla.req_id_per_token.tolist() == reference([4, 0, 1, 3], 10)
    assert compressor.token_to_req_indices is mla.req_id_per_token
    assert swa is mla.req_id_per_token
    # the rows live in the first builder's buffer, as with vLLM's own cache
    assert swa.data_ptr() == mla_buffer.data_ptr()
    assert int(compressor_buffer.abs().sum()) == int(swa_buffer.abs().sum()) == 0


def test_v1_group_copies_in_a_build_share_one_computation(
    plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    count_index_computations: list[int],
) -> None:
    """vLLM's V1 runner makes ``copy(cm_base)`` per KV-cache group and changes only
    the block table and slot mapping, inside the build's scope (the plugin opens it:
    tests/vllm_plugin/test_vllm_scopes.py); outside one, each copy computes its own."""
    cm_base = make_metadata([1, 1, 4], pad_to=8)

    def build() -> list[torch.Tensor]:
        groups = []
        for gid in range(3):
            cm = copy.copy(cm_base)
            cm.block_table_tensor = cm_base.block_table_tensor + gid
            cm.slot_mapping = cm_base.slot_mapping + gid
            groups.append(cm)
        return [
            g.token_to_req_indices(torch.zeros(16, dtype=torch.int32)) for g in groups
        ]

    with stepcache.scope():
        rows = build()
    assert count_index_computations == [1]
    assert all(r is rows[0] for r in rows)
    assert rows[0].tolist() == [0, 1, 2, 2, 2, 2, 0, 0]
    build()
    assert count_index_computations == [1, 1, 1, 1]


def test_vllms_kernel_computes_where_the_buffer_is_not_on_the_cpu(
    plugin_on: ModuleType,
    stock_kernel: None,
    make_metadata: Callable[..., Metadata],
    monkeypatch: pytest.MonkeyPatch,
    count_index_computations: list[int],
) -> None:
    """The device branch (vLLM's own method, its Triton kernel), made to run here by
    treating the CPU as a device; the kernel runs in Triton's interpreter."""
    kernel_calls: list[int] = []
    original = _vllm_metadata._original["token_to_req_indices"]

    def counting(self: Any, buffer: torch.Tensor) -> torch.Tensor:
        kernel_calls.append(1)
        result: torch.Tensor = original(self, buffer)
        return result

    monkeypatch.setitem(_vllm_metadata._original, "token_to_req_indices", counting)
    monkeypatch.setattr(_vllm_metadata, "uses_kernel", lambda device: True)
    cam = make_metadata([2, 0, 3], pad_to=7)
    buffer = torch.zeros(16, dtype=torch.int32)
    rows = cam.token_to_req_indices(buffer)
    assert cam.token_to_req_indices(torch.zeros(16, dtype=torch.int32)) is rows
    assert rows.tolist() == [0, 0, 2, 2, 2, 0, 0]
    assert kernel_calls == [1]
    assert count_index_computations == []  # numpy never ran
    other = via_draft_loop(cam)
    assert other.token_to_req_indices(buffer).tolist() == [0, 1, 2]
    assert kernel_calls == [1, 1]


def test_bad_buffers_raise_typed_errors_instead_of_asserts(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    cam = make_metadata([3, 2], pad_to=8)
    with pytest.raises(stepcache.CacheValidationError, match="at least 8 rows"):
        cam.token_to_req_indices(torch.zeros(6, dtype=torch.int32))
    with pytest.raises(stepcache.CacheValidationError, match="must be int32"):
        cam.token_to_req_indices(torch.zeros(8, dtype=torch.int64))
    cam.query_start_loc = torch.tensor([0, 3, 2], dtype=torch.int32)
    cam.query_start_loc_cpu = cam.query_start_loc.clone()
    # the layout's values are debug mode's job; production fails as the seed would
    with pytest.raises(ValueError, match="negative"):
        cam.token_to_req_indices(torch.zeros(8, dtype=torch.int32))
    with stepcache.debug("checks"), pytest.raises(ValueError, match="never decrease"):
        cam.token_to_req_indices(torch.zeros(8, dtype=torch.int32))


def test_num_computed_tokens_keeps_vllms_field_on_the_same_layout(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """Patched for the GDN builder's groups
    (tests/vllm_plugin/test_vllm_layout_caches.py), but vLLM's field still answers
    once filled: stale after an in-place change of seq_lens on the same object, as
    without the plugin (a step's tensors are inference tensors: nothing to see)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from stepcache.integrations.vllm.computed_tokens import COMPUTED_NAME

    method = CommonAttentionMetadata.compute_num_computed_tokens
    assert getattr(method, "__stepcache_patch__", None) == COMPUTED_NAME
    cam = make_metadata([3, 1])  # context 5: 5 tokens computed before each query
    first = cam.compute_num_computed_tokens()
    assert first.tolist() == [5, 5]
    assert cam.compute_num_computed_tokens() is first
    cam.seq_lens += 2  # the draft loop subtracts rejected tokens in place
    assert cam.compute_num_computed_tokens().tolist() == [5, 5]


def test_num_computed_tokens_of_a_replaced_layout_is_computed_again(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """replace() carries vLLM's field into the copy, whose seq_lens differ: stock
    returns the original's value (tests/vllm_plugin/test_vllm_replace.py), the
    plugin computes the copy's."""
    cam = make_metadata([3, 1])
    assert cam.compute_num_computed_tokens().tolist() == [5, 5]
    copy = cam.replace(seq_lens=cam.seq_lens + 2)
    assert copy.compute_num_computed_tokens().tolist() == [7, 7]
    assert cam.compute_num_computed_tokens().tolist() == [5, 5]


def test_with_caching_off_every_call_computes(
    plugin: ModuleType,
    make_metadata: Callable[..., Metadata],
    count_index_computations: list[int],
) -> None:
    """STEPCACHE_DISABLE / stepcache.disabled(): not even vLLM's field answers."""
    cam = make_metadata([2, 2])
    with stepcache.disabled():
        for _ in range(3):
            rows = cam.token_to_req_indices(torch.zeros(8, dtype=torch.int32))
            assert rows.tolist() == [0, 0, 1, 1]
    assert count_index_computations == [1, 1, 1]


def test_verify_mode_checks_the_index_against_vllms_kernel(
    verify_plugin: ModuleType,
    stock_kernel: None,
    make_metadata: Callable[..., Metadata],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcache.integrations import vllm as plugin

    plugin.reset_counters()
    cam = make_metadata([2, 0, 3], pad_to=7)
    assert cam.token_to_req_indices(torch.zeros(16, dtype=torch.int32)).tolist() == [
        0, 0, 2, 2, 2, 0, 0,
    ]  # fmt: skip
    # its copy for stock vLLM is not counted as one of vLLM's copies
    assert plugin.counters() == {_vllm_metadata.INDEX_NAME: {"verified": 1}}
    # a wrong index (a planted bug in the numpy path) is caught, naming the patch
    monkeypatch.setattr(
        _vllm_metadata,
        "request_index_array",
        lambda qsl: np.zeros(int(qsl[-1]), dtype=np.int32),
    )
    other = make_metadata([1, 2])
    with pytest.raises(stepcache.StaleCacheError) as caught:
        other.token_to_req_indices(torch.zeros(16, dtype=torch.int32))
    assert str(caught.value).startswith(
        "stepcache verify: the patch vllm.CommonAttentionMetadata.token_to_req_indices "
        "gave another value than stock vLLM: tensor 'result' value mismatch at flat "
        "index 1. expected 1, actual 0."
    )


def test_every_patch_runs_on_inference_tensors_as_a_step_makes_them(
    plugin: ModuleType, make_metadata: Callable[..., Metadata]
) -> None:
    """vLLM's steps run under ``torch.inference_mode()``: tensors made in the step have
    no version counter. The patched calls give stock's values on them, and a layout
    made of inference tensors is never answered from vLLM's field."""
    from vllm.models.deepseek_v4 import compressor

    with torch.inference_mode():
        # a request that crosses a 128-token boundary: 126 % 128 + 3 >= 128
        cam = make_metadata([3, 1, 2], pad_to=8, context=126)
        assert cam.query_start_loc.is_inference()
        groups = [copy.copy(cam) for _ in range(3)]
        rows = [
            g.token_to_req_indices(torch.zeros(16, dtype=torch.int32)) for g in groups
        ]
        assert all(r.tolist() == [0, 0, 0, 1, 2, 2, 0, 0] for r in rows)
        assert compressor._get_c128_boundary(cam) is True
        # the draft loop: the same object, one token per request, new tensors
        cam.query_start_loc = torch.arange(4, dtype=torch.int32)
        cam.query_start_loc_cpu = torch.arange(4, dtype=torch.int32)
        cam.num_actual_tokens = 3
        again = cam.token_to_req_indices(torch.zeros(16, dtype=torch.int32))
        assert again.tolist() == [0, 1, 2]
