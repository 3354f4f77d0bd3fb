# SPDX-License-Identifier: Apache-2.0
"""Forward passes of SGLang 0.5.23, built by its real classes on the CPU."""

from __future__ import annotations

import types
from typing import Any

import torch
from sglang.srt.batch_overlap.two_batch_overlap import (
    TboForwardBatchPreparer,
    compute_split_seq_index,
)
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

#: a pass's layout: four requests, two of them resuming a cached prefix
EXTEND_LENS = [4, 3, 3, 4]
PREFIX_LENS = [0, 4, 0, 2]
#: Qwen3-Next-80B has 36 GDN layers (and 12 full-attention ones)
GDN_LAYERS = 36


class ReqToTokenPool:
    """The request pool's mamba side, as the GDN backend reads it."""

    mamba_pool = None
    size = 16

    def __init__(self) -> None:
        self.mapping = torch.arange(16, dtype=torch.int32) + 100

    def get_mamba_indices(self, req_indices: torch.Tensor) -> torch.Tensor:
        return self.mapping[req_indices]

    def translate_mamba_indices(self, indices: torch.Tensor) -> torch.Tensor:
        return indices


def gdn_backend() -> GDNAttnBackend:
    """SGLang's GDN backend without a model runner (what its ``__init__`` reads of
    one: the GPU pools and kernels)."""
    backend = GDNAttnBackend.__new__(GDNAttnBackend)
    backend.device = "cpu"
    backend.req_to_token_pool = ReqToTokenPool()
    backend.topk = 1
    backend.enable_mis = False
    backend.kernel_dispatcher = types.SimpleNamespace(
        extend_uses_state_checkpoints=False
    )
    return backend


def forward_batch(mode: ForwardMode, tbo: bool = False) -> ForwardBatch:
    """A pass of four requests: an extend (``EXTEND_LENS`` new tokens after
    ``PREFIX_LENS``) or a decode (one token each); ``tbo``: split for two-batch
    overlap as the scheduler marks it."""
    extend = mode == ForwardMode.EXTEND
    lens = EXTEND_LENS if extend else [1] * len(EXTEND_LENS)
    prefix = PREFIX_LENS if extend else [9, 5, 7, 3]
    tokens = sum(lens)
    seq_lens = torch.tensor([a + b for a, b in zip(lens, prefix, strict=True)])
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=len(lens),
        input_ids=torch.arange(tokens),
        req_pool_indices=torch.tensor([1, 2, 3, 4]),
        seq_lens=seq_lens,
        out_cache_loc=torch.arange(tokens),
        seq_lens_sum=int(seq_lens.sum()),
    )
    batch.seq_lens_cpu = seq_lens.clone()
    batch.req_pool_indices_cpu = batch.req_pool_indices.clone()
    batch.positions = torch.arange(tokens)
    if extend:
        batch.extend_seq_lens = torch.tensor(lens, dtype=torch.int32)
        batch.extend_prefix_lens = torch.tensor(prefix, dtype=torch.int32)
        starts = [sum(lens[:i]) for i in range(len(lens))]
        batch.extend_start_loc = torch.tensor(starts, dtype=torch.int32)
        batch.extend_seq_lens_cpu = list(lens)
        batch.extend_prefix_lens_cpu = list(prefix)
        batch.extend_logprob_start_lens_cpu = [0] * len(lens)
        batch.extend_num_tokens = tokens
    if tbo:
        batch.global_num_token_non_padded_cpu = tokens
        batch.tbo_split_seq_index = compute_split_seq_index(
            mode, tokens, batch.extend_seq_lens_cpu, None if extend else 1
        )
    return batch


class Layer:
    """What the conv reads of a GDN layer."""

    conv_weights = None
    bias = None
    activation = "silu"


def run_gdn_pass(backend: GDNAttnBackend, batch: ForwardBatch) -> dict[str, Any]:
    """One pass's metadata build, then each GDN layer's prefill convolution (an
    extend); the metadata it built."""
    backend.init_forward_metadata(batch)
    metadata = backend.forward_metadata
    if batch.forward_mode.is_extend():
        qkv = torch.zeros(int(batch.input_ids.numel()), 8)
        for _ in range(GDN_LAYERS):
            backend._convolve_prefill(
                Layer(), batch, qkv, torch.zeros(1), metadata.mamba_cache_indices
            )
    return {
        "query_start_loc": metadata.query_start_loc,
        "mamba_cache_indices": metadata.mamba_cache_indices,
        "logical_num_tokens": metadata.logical_num_tokens,
        "has_mamba_track_mask": metadata.has_mamba_track_mask,
    }


def prepare_tbo(batch: ForwardBatch) -> list[ForwardBatch]:
    """SGLang's two-batch-overlap split of ``batch``: its two children."""
    TboForwardBatchPreparer.prepare(batch)
    assert batch.tbo_children is not None
    return list(batch.tbo_children)
