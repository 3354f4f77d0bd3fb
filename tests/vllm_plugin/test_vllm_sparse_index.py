# SPDX-License-Identifier: Apache-2.0
"""The FlashInfer DSv4 sparse-index cache with the plugin, tested as vLLM tests its
own (tests/kernels/attention/test_flashmla_sparse.py): vLLM's real
``_build_sparse_index_metadata`` on real DSv4 metadata, with a counting fake index
builder (put on the module before or after the plugin loads) in place of the
FlashInfer one, which needs a GPU. The pairs are kept per SWA metadata object, keyed
as vLLM keys its dict: in production in that dict, bound to its object; in debug
mode in a stepcache cache on the object. Either way vLLM's ``clear()`` in draft
steps rebuilds, and nothing is shared across steps or objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from benchmarks.bench_engine import swa_metadata

pytestmark = pytest.mark.vllm


class FakeBuild:
    """Returns a fresh pair on every call, and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return (
            torch.tensor([[self.calls]], dtype=torch.int32),
            torch.tensor([self.calls], dtype=torch.int32),
        )


@pytest.fixture(params=["before", "after"])
def fake_build(
    request: pytest.FixtureRequest,
    register_plugin: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[FakeBuild]:
    """The fake put where vLLM's test puts it, before or after the plugin loads."""
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    fake = FakeBuild()
    if request.param == "before":
        monkeypatch.setattr(
            flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
        )
    register_plugin()
    if request.param == "after":
        monkeypatch.setattr(
            flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
        )
    yield fake


def make_attn(compress_ratio: int, topk_width: int) -> Any:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    attn = object.__new__(flashinfer_sparse.DeepseekV4FlashInferMLAAttention)
    attn.compress_ratio = compress_ratio
    attn.window_size = 4
    attn.topk_indices_buffer = torch.tensor(
        [[0, 1], [2, 3], [4, 5]], dtype=torch.int32
    )[:, :topk_width]
    return attn


def make_swa_metadata() -> Any:
    return swa_metadata()


def make_flashmla_metadata(c128a: bool) -> Any:
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLAMetadata

    return DeepseekV4FlashMLAMetadata(
        num_reqs=2,
        max_query_len=2,
        max_seq_len=10,
        num_actual_tokens=3,
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int64),
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        req_id_per_token=torch.tensor([0, 1, 1], dtype=torch.int32),
        block_size=256,
        topk_tokens=2,
        c128a_global_decode_topk_indices=(
            torch.tensor([[[9, 10]]], dtype=torch.int32) if c128a else None
        ),
        c128a_decode_topk_lens=torch.tensor([2], dtype=torch.int32) if c128a else None,
        c128a_prefill_topk_indices=(
            torch.tensor([[0, 1], [1, 2]], dtype=torch.int32) if c128a else None
        ),
    )


def build(attn: Any, swa_metadata: Any, kind: str, num_rows: int | None = None) -> Any:
    swa_only = kind == "swa_only"
    return attn._build_sparse_index_metadata(
        kv_cache=None if swa_only else torch.empty((1, 2, 512), dtype=torch.bfloat16),
        swa_k_cache=torch.empty((1, 64, 512), dtype=torch.bfloat16),
        swa_metadata=swa_metadata,
        attn_metadata=None if swa_only else make_flashmla_metadata(kind == "c128a"),
        swa_only=swa_only,
        num_rows=num_rows,
    )


KINDS = {"swa_only": (1, 0), "c128a": (128, 2), "c4a": (4, 2)}


@pytest.mark.parametrize(
    ("kind", "builds", "same"),
    [("swa_only", 1, True), ("c128a", 1, True), ("c4a", 2, False)],
)
def test_two_calls_per_kind_like_vllms_test(
    fake_build: FakeBuild, kind: str, builds: int, same: bool
) -> None:
    attn = make_attn(*KINDS[kind])
    swa_metadata = make_swa_metadata()
    _, _, indices_1, lens_1 = build(attn, swa_metadata, kind)
    _, _, indices_2, lens_2 = build(attn, swa_metadata, kind)
    assert fake_build.calls == builds
    assert (indices_1 is indices_2) is same
    assert (lens_1 is lens_2) is same
    # vLLM's own dict holds the pair, as in stock vLLM
    cached = dict(swa_metadata.flashinfer_sparse_index_cache)
    assert list(cached) == ([kind] if same else [])
    if same:
        assert cached[kind][0] is indices_1


def test_layers_share_the_pair_but_keep_their_own_kv_cache(
    fake_build: FakeBuild,
) -> None:
    swa_metadata = make_swa_metadata()
    first, second = make_attn(128, 2), make_attn(128, 2)
    kv_1 = torch.empty((1, 2, 512), dtype=torch.bfloat16)
    kv_2 = torch.empty((1, 2, 512), dtype=torch.bfloat16)
    results = [
        attn._build_sparse_index_metadata(
            kv_cache=kv,
            swa_k_cache=torch.empty((1, 64, 512), dtype=torch.bfloat16),
            swa_metadata=swa_metadata,
            attn_metadata=make_flashmla_metadata(True),
            swa_only=False,
        )
        for attn, kv in ((first, kv_1), (second, kv_2))
    ]
    assert fake_build.calls == 1
    assert results[0][2] is results[1][2] and results[0][3] is results[1][3]
    assert results[0][0] is kv_1 and results[1][0] is kv_2


@pytest.mark.parametrize("kind", ["swa_only", "c128a"])
@pytest.mark.parametrize("num_rows", [None, 3, 5])
def test_a_hit_returns_what_stock_returns_when_its_dict_holds_the_pair(
    fake_build: FakeBuild, kind: str, num_rows: int | None
) -> None:
    from stepcache.integrations import vllm as plugin

    swa_metadata = make_swa_metadata()
    # the lengths in a persistent buffer longer than the batch, as a CUDA graph's
    swa_metadata.seq_lens = torch.tensor([8, 10, 7, 7], dtype=torch.int32)
    build(make_attn(*KINDS[kind]), swa_metadata, kind, num_rows)  # builds
    layer = make_attn(*KINDS[kind])  # another layer of the kind, its own tensors
    kv_cache = torch.empty((1, 2, 512), dtype=torch.bfloat16)
    swa_k_cache = torch.empty((1, 64, 512), dtype=torch.bfloat16)
    attn_metadata = None if kind == "swa_only" else make_flashmla_metadata(True)
    call = {
        "kv_cache": None if kind == "swa_only" else kv_cache,
        "swa_k_cache": swa_k_cache,
        "swa_metadata": swa_metadata,
        "attn_metadata": attn_metadata,
        "swa_only": kind == "swa_only",
        "num_rows": num_rows,
    }
    hit = layer._build_sparse_index_metadata(**call)
    assert fake_build.calls == 1
    plugin.unregister()  # stock vLLM, on the dict that holds the pair
    stock = layer._build_sparse_index_metadata(**call)
    assert fake_build.calls == 1
    assert hit[0] is stock[0]
    assert hit[1].dtype == stock[1].dtype and hit[1].tolist() == stock[1].tolist()
    assert hit[1].data_ptr() == stock[1].data_ptr()  # a view of the same lengths
    assert hit[2] is stock[2] and hit[3] is stock[3]


def test_row_counts_are_separate_entries_and_steps_do_not_share(
    fake_build: FakeBuild,
) -> None:
    attn = make_attn(1, 0)
    step = make_swa_metadata()
    build(attn, step, "swa_only")
    build(attn, step, "swa_only", num_rows=8)
    build(attn, step, "swa_only", num_rows=8)
    assert fake_build.calls == 2
    build(attn, make_swa_metadata(), "swa_only")  # the next step
    assert fake_build.calls == 3


def test_vllms_clear_in_a_draft_step_rebuilds(fake_build: FakeBuild) -> None:
    """vLLM's ``update_draft_decode_metadata`` rewrites the decode tensors of the same
    metadata in place, then calls ``flashinfer_sparse_index_cache.clear()``."""
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    _, _, first, _ = build(attn, swa_metadata, "swa_only")
    swa_metadata.decode_swa_indices.copy_(torch.tensor([[7, 8, 9, -1]]))
    swa_metadata.flashinfer_sparse_index_cache.clear()
    _, _, second, _ = build(attn, swa_metadata, "swa_only")
    assert fake_build.calls == 2
    assert second is not first and second.tolist() == [[2]]
    build(attn, swa_metadata, "swa_only")
    assert fake_build.calls == 2


def test_vllms_own_draft_update_clears_the_dict_the_plugin_keeps(
    fake_build: FakeBuild,
) -> None:
    """The real ``update_draft_decode_metadata`` ends with the ``clear()``: it empties
    the dict that the patched method reads."""
    import inspect

    from vllm.v1.attention.backends.mla import sparse_swa

    source = inspect.getsource(
        sparse_swa.DeepseekSparseSWAMetadataBuilder.update_draft_decode_metadata
    )
    assert "metadata.flashinfer_sparse_index_cache.clear()" in source
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    build(attn, swa_metadata, "swa_only")
    cache = swa_metadata.flashinfer_sparse_index_cache
    assert len(cache) == 1
    cache.clear()  # what that method does on the same object
    assert len(cache) == 0
    assert len(swa_metadata.flashinfer_sparse_index_cache) == 0
    build(attn, swa_metadata, "swa_only")  # the pairs before the clear() do not serve
    assert fake_build.calls == 2


def test_nothing_is_kept_in_a_global(fake_build: FakeBuild) -> None:
    import gc
    import weakref

    from stepcache.integrations.vllm import dsv4 as _vllm_dsv4

    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    _, _, indices, _ = build(attn, swa_metadata, "swa_only")
    gone = weakref.ref(indices)
    del swa_metadata, indices
    gc.collect()
    assert gone() is None  # the pair died with its metadata
    assert set(_vllm_dsv4._original) <= {
        _vllm_dsv4.SPARSE_INDEX_NAME,
        _vllm_dsv4.SPARSE_INDEX_V41_NAME,
        "c128_boundary",
    }


def test_calls_from_outside_the_method_are_not_cached(fake_build: FakeBuild) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    flashinfer_sparse.build_flashinfer_mixed_sparse_indices()
    flashinfer_sparse.build_flashinfer_mixed_sparse_indices()
    assert fake_build.calls == 2


def test_a_replaced_swa_metadata_gets_its_own_indices(fake_build: FakeBuild) -> None:
    """Stock vLLM's dict is a dataclass field: dataclasses.replace() hands it, with
    the earlier pair, to metadata with other token mappings. The plugin's entries
    belong to the object."""
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    _, _, indices, _ = build(attn, swa_metadata, "swa_only")
    other = dataclasses.replace(
        swa_metadata, token_to_req_indices=torch.tensor([0, 0, 1], dtype=torch.int32)
    )
    assert (
        other.flashinfer_sparse_index_cache
        is swa_metadata.flashinfer_sparse_index_cache
    )
    _, _, other_indices, _ = build(attn, other, "swa_only")
    assert other_indices is not indices
    assert fake_build.calls == 2
    # each keeps its own pair
    assert build(attn, swa_metadata, "swa_only")[2] is indices
    assert build(attn, other, "swa_only")[2] is other_indices
    assert fake_build.calls == 2


def test_stock_vllm_hands_a_replaced_swa_metadata_the_earlier_pair(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    from stepcache.integrations import vllm as plugin

    plugin.unregister()
    fake = FakeBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    _, _, indices, _ = build(attn, swa_metadata, "swa_only")
    other = dataclasses.replace(
        swa_metadata, token_to_req_indices=torch.tensor([0, 0, 1], dtype=torch.int32)
    )
    _, _, other_indices, _ = build(attn, other, "swa_only")
    assert other_indices is indices  # built for the other token mapping
    assert fake.calls == 1


def test_a_plain_dict_vllm_puts_on_the_field_becomes_the_objects_own(
    fake_build: FakeBuild,
) -> None:
    """A plain dict's pairs may be another object's (metadata made before the plugin
    loaded, then replaced): they never serve."""
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    other = (torch.tensor([[-1]], dtype=torch.int32), torch.tensor([-1]))
    swa_metadata.flashinfer_sparse_index_cache = {"swa_only": other}
    _, _, indices, _ = build(attn, swa_metadata, "swa_only")
    assert indices.tolist() == [[1]]
    assert build(attn, swa_metadata, "swa_only")[2] is indices
    assert fake_build.calls == 1
    assert dict(swa_metadata.flashinfer_sparse_index_cache) == {
        "swa_only": (indices, swa_metadata.flashinfer_sparse_index_cache["swa_only"][1])
    }


# -- DeepSeek V4.1's copy of the cache -------------------------------------------------
def make_v41_attn() -> Any:
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    attn = object.__new__(flashinfer_sparse.DeepseekV4FlashInferMLAAttention)
    attn.compress_ratio = 1
    attn.window_size = 4
    attn.topk_indices_buffer = torch.zeros((3, 0), dtype=torch.int32)
    return attn


def test_v41_swa_only_layers_build_once_per_step_and_honour_clear(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    import stepcache

    plugin = register_plugin()
    plugin.reset_counters()
    stepcache.reset_stats()
    fake = FakeBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    attn, other_layer = make_v41_attn(), make_v41_attn()
    swa_metadata = make_swa_metadata()
    swa_metadata.replay_start = torch.zeros(2, dtype=torch.int32)

    def call(layer: Any, metadata: Any) -> Any:
        return layer._build_sparse_index_metadata(
            kv_cache=None,
            swa_k_cache=torch.empty((1, 64, 512), dtype=torch.bfloat16),
            swa_metadata=metadata,
            attn_metadata=None,
            swa_only=True,
        )

    first = call(attn, swa_metadata)
    second = call(other_layer, swa_metadata)
    assert fake.calls == 1 and first[2] is second[2]
    swa_metadata.flashinfer_sparse_index_cache.clear()
    assert call(attn, swa_metadata)[2] is not first[2]
    assert fake.calls == 2
    other = dataclasses.replace(swa_metadata)
    call(attn, other)
    assert fake.calls == 3
    row = stepcache.stats()["vllm.dsv41.flashinfer_sparse_index"]
    # the clear() is an invalidation; the replaced object's dict is a new one
    assert (row.misses, row.hits, row.invalidations) == (3, 1, 1)
    assert "vllm.dsv41.flashinfer_sparse_index" not in plugin.counters()


# -- parity mode -----------------------------------------------------------------------
def test_verify_mode_compares_with_stock_and_names_the_patch(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    import stepcache

    register_plugin("verify")
    fake = FakeBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    attn = make_attn(1, 0)
    swa_metadata = make_swa_metadata()
    with pytest.raises(stepcache.StaleCacheError) as caught:
        # the fake returns another pair on every call: stock's build differs
        build(attn, swa_metadata, "swa_only")
    message = str(caught.value)
    assert "vllm.dsv4.flashinfer_sparse_index" in message
    assert (
        "tensor 'result[2]' value mismatch at flat index 0. expected 2, actual 1"
        in message
    )


def test_verify_mode_passes_when_the_cache_is_right(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    import stepcache

    plugin = register_plugin("verify")

    def pure_build(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor([[7]], dtype=torch.int32), torch.tensor(
            [1], dtype=torch.int32
        )

    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", pure_build
    )
    plugin.reset_counters()
    stepcache.reset_stats()
    attn = make_attn(128, 2)
    swa_metadata = make_swa_metadata()
    for _ in range(3):
        build(attn, swa_metadata, "c128a")
    counts = plugin.counters()["vllm.dsv4.flashinfer_sparse_index"]
    assert counts == {"verified": 3}
    row = stepcache.stats()["vllm.dsv4.flashinfer_sparse_index"]
    assert (row.misses, row.hits) == (1, 2)


# -- where the pairs are counted: production, debug mode, caching off -------------------
def _steps(attn: Any) -> Any:
    """Two layers of one kind in two steps, with vLLM's clear() in the first: three
    builds, one hit."""
    step = make_swa_metadata()
    build(attn, step, "c128a")
    step.flashinfer_sparse_index_cache.clear()
    build(attn, step, "c128a")
    build(attn, step, "c128a")
    return build(attn, make_swa_metadata(), "c128a")


class PureBuild(FakeBuild):
    """Counts the calls, and returns the same values on every call (as FlashInfer's
    build does for one step's metadata): debug mode's checks may build again."""

    def __call__(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        return torch.tensor([[7]], dtype=torch.int32), torch.tensor(
            [1], dtype=torch.int32
        )


@pytest.mark.parametrize("mode", ["off", "checks"])
def test_every_mode_counts_the_pairs_in_stepcache_stats(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    import stepcache

    plugin = register_plugin()
    fake = PureBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    plugin.reset_counters()
    stepcache.reset_stats()
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        _steps(make_attn(128, 2))
    name = "vllm.dsv4.flashinfer_sparse_index"
    # one code path: stepcache's cache, its stats; vLLM's clear() an invalidation
    row = stepcache.stats()[name]
    assert (row.misses, row.hits, row.invalidations) == (3, 1, 1)
    assert name not in plugin.counters()
    assert list(stepcache.debug_report()) == []
    if mode == "off":  # debug mode may build again to check
        assert fake.calls == 3


def test_with_caching_off_every_layer_builds(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    import stepcache

    register_plugin()
    fake = FakeBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    with stepcache.disabled():
        _, _, indices, _ = _steps(make_attn(128, 2))
    assert fake.calls == 4
    assert indices.tolist() == [[4]]


def test_no_pair_from_before_a_clear_serves_as_debug_mode_goes_on_and_off(
    register_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production and debug mode share the cache; vLLM's clear() between them, seen
    or not, leaves no pair from before it."""
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    import stepcache

    register_plugin()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", PureBuild()
    )
    attn = make_attn(128, 2)
    for first, then in [("checks", "off"), ("off", "checks")]:
        step = make_swa_metadata()
        with stepcache.debug(first):
            before = build(attn, step, "c128a")[2]
        with stepcache.debug(then):
            again = build(attn, step, "c128a")[2]
        # one cache in every mode: what one mode stored serves the other
        assert torch.equal(again, before)
        step.flashinfer_sparse_index_cache.clear()
        for mode in (first, then):
            with stepcache.debug(mode):
                assert build(attn, step, "c128a")[2] is not before
