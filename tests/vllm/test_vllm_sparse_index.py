# SPDX-License-Identifier: Apache-2.0
"""The plugin's FlashInfer DSv4 sparse-index cache, tested as vLLM tests its own
(tests/kernels/attention/test_flashmla_sparse.py): vLLM's real
``_build_sparse_index_metadata`` on real DSv4 metadata, with a counting fake index
builder in place of the FlashInfer one (which needs a GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

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


@pytest.fixture
def fake_build(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeBuild]:
    """The fake put where vLLM's test puts it, then the plugin registered over it."""
    from vllm.models.deepseek_v4.nvidia import flashinfer_sparse

    from stepcache.integrations import vllm as plugin

    plugin.unregister()
    fake = FakeBuild()
    monkeypatch.setattr(
        flashinfer_sparse, "build_flashinfer_mixed_sparse_indices", fake
    )
    plugin.register()
    assert plugin.status()["vllm.dsv4.flashinfer_sparse_index"] == "applied"
    yield fake
    plugin.unregister()


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
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    return DeepseekSparseSWAMetadata(
        block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        slot_mapping=torch.tensor([0, 1], dtype=torch.int64),
        block_size=64,
        seq_lens=torch.tensor([8, 10], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1, 3], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 3], dtype=torch.int32),
        token_to_req_indices=torch.tensor([0, 1, 1], dtype=torch.int32),
        decode_swa_indices=torch.tensor([[5, 6, -1, -1]], dtype=torch.int32),
        decode_swa_lens=torch.tensor([2], dtype=torch.int32),
        decode_swa_width=4,
        is_valid_token=torch.tensor([True], dtype=torch.bool),
        num_decodes=1,
        num_prefills=1,
        num_decode_tokens=1,
        num_prefill_tokens=2,
    )


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
    # vLLM's own dict stays empty: stepcache holds the pair
    assert dict(swa_metadata.flashinfer_sparse_index_cache) == {}


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
    _, _, other_indices, _ = build(attn, other, "swa_only")
    assert other_indices is not indices
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
