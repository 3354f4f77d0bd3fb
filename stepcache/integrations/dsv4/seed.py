# SPDX-License-Identifier: Apache-2.0
"""The seeds' code, written from the PR description: the baseline stepcache is measured
against.

Two ways vLLM fills a DSv4 consumer's request-index buffer, as vLLM PR 47474
describes them, written here from that description and calling none of stepcache's helpers, so that a benchmark
that compares stepcache with them measures stepcache, not its own helpers twice:

* :func:`uncached_token_to_req_indices` is vLLM before the PR: every consumer (the
  sparse-MLA, compressor and sparse-SWA builders) computes
  ``np.repeat(np.arange(num_reqs), np.diff(query_start_loc_cpu))`` itself, stages it
  in a host tensor and copies it into its own buffer with ``non_blocking=True``, then
  zeroes the padding;
* :func:`handwritten_token_to_req_indices` is the PR as merged, the method
  ``CommonAttentionMetadata.token_to_req_indices``: the first call of a step computes
  the index that way into the caller's buffer and keeps the rows in the metadata's
  ``_token_to_req_indices_cache`` slot; every later call checks device, dtype and
  length with three asserts and returns a new slice of it.

Both read only the host copy of the layout (``query_start_loc_cpu``). The staging
tensor is pinned when the buffer is on a CUDA device, as vLLM's
``np_to_pinned_tensor``; for a CPU buffer (pinning needs CUDA) it is a plain host
tensor.

>>> import torch
>>> qsl = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
>>> meta = SeedMetadata(qsl, qsl.clone(), num_actual_tokens=7)
>>> buffer = torch.full((8,), -1, dtype=torch.int32)
>>> handwritten_token_to_req_indices(meta, buffer).tolist()
[0, 0, 2, 2, 2, 0, 0]
>>> meta.token_to_req_indices(torch.empty(8, dtype=torch.int32)).data_ptr() == (
...     buffer.data_ptr())  # a later consumer gets the first one's rows
True
>>> uncached_token_to_req_indices(meta, torch.empty(8, dtype=torch.int32)).tolist()
[0, 0, 2, 2, 2, 0, 0]
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np
import torch

__all__ = [
    "HandwrittenBatch",
    "SeedBatch",
    "SeedMetadata",
    "handwritten_token_to_req_indices",
    "uncached_token_to_req_indices",
]


class SeedBatch(Protocol):
    """What the seeds' code reads from the step's metadata."""

    #: ``(num_reqs + 1,)`` start of each request's tokens, on the host
    query_start_loc_cpu: torch.Tensor
    #: rows the caller wants, padding included
    num_actual_tokens: int


class HandwrittenBatch(SeedBatch, Protocol):
    """:class:`SeedBatch` with the PR's cache slot."""

    _token_to_req_indices_cache: torch.Tensor | None


def _staged(index: np.ndarray, buffer: torch.Tensor) -> torch.Tensor:
    """``index`` as a host tensor to copy from: pinned for a CUDA buffer."""
    host = torch.from_numpy(index)
    return host.pin_memory() if buffer.is_cuda else host


def uncached_token_to_req_indices(
    meta: SeedBatch, buffer: torch.Tensor
) -> torch.Tensor:
    """vLLM before PR 47474: one consumer's own computation and copy, every call."""
    num_tokens = meta.num_actual_tokens
    starts = np.asarray(meta.query_start_loc_cpu, dtype=np.int32)
    num_reqs = starts.shape[0] - 1
    index = np.repeat(np.arange(num_reqs, dtype=np.int32), np.diff(starts))
    num_mapped_tokens = index.shape[0]
    buffer[:num_mapped_tokens].copy_(_staged(index, buffer), non_blocking=True)
    if num_mapped_tokens < num_tokens:
        buffer[num_mapped_tokens:num_tokens].zero_()
    return buffer[:num_tokens]


def handwritten_token_to_req_indices(
    self: HandwrittenBatch, buffer: torch.Tensor
) -> torch.Tensor:
    """PR 47474 as merged: build the per-token request index once, then reuse it.

    A method of the step's metadata in vLLM (``self``); its hit branch is the text
    vLLM 0.33 ships (``tests/benchmarks`` compares the source)."""
    num_tokens = self.num_actual_tokens
    if self._token_to_req_indices_cache is not None:
        assert self._token_to_req_indices_cache.device == buffer.device
        assert self._token_to_req_indices_cache.dtype == torch.int32
        assert self._token_to_req_indices_cache.shape[0] >= num_tokens
        return self._token_to_req_indices_cache[:num_tokens]

    starts = np.asarray(self.query_start_loc_cpu, dtype=np.int32)
    query_lens = np.diff(starts)
    token_to_req_indices = np.repeat(
        np.arange(query_lens.shape[0], dtype=np.int32), query_lens
    )
    num_mapped_tokens = token_to_req_indices.shape[0]
    assert buffer.shape[0] >= max(num_mapped_tokens, num_tokens)
    buffer[:num_mapped_tokens].copy_(
        _staged(token_to_req_indices, buffer), non_blocking=True
    )
    if num_mapped_tokens < num_tokens:
        buffer[num_mapped_tokens:num_tokens].zero_()
    self._token_to_req_indices_cache = buffer[: max(num_mapped_tokens, num_tokens)]
    return self._token_to_req_indices_cache[:num_tokens]


@dataclasses.dataclass
class SeedMetadata:
    """The fields of vLLM's ``CommonAttentionMetadata`` the seeds read, with the PR's
    method."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    num_actual_tokens: int
    _token_to_req_indices_cache: torch.Tensor | None = None

    token_to_req_indices = handwritten_token_to_req_indices
