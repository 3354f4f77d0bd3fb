# SPDX-License-Identifier: Apache-2.0
"""Two hand-written request-index caches, as baselines for the benchmarks.

:class:`SeedMetadata` is the seeds' cache (vLLM PR 47474), written from the PR report
in ``shared/seeds``: a ``_token_to_req_indices_cache`` slot on the step metadata; the
first call computes the index with numpy and copies it into the caller's buffer, every
later call checks the cached tensor with three asserts and returns a new slice of it.
Its hit branch is the one stock vLLM 0.33 ships
(``CommonAttentionMetadata.token_to_req_indices`` in ``vllm/v1/attention/backend.py``,
checked by ``tests/benchmarks``); its miss differs (on the CPU the PR's pinned staging
copy is a plain copy; vLLM 0.33 computes on the device).

:class:`KeptSliceMetadata` is the cheapest correct-looking cache of the same value: it
keeps the slice it returned and hands it back, checking nothing. It is not in any
seed; it is the floor a cache that stores its result can reach in Python.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

__all__ = [
    "KeptSliceMetadata",
    "SeedMetadata",
    "kept_slice_token_to_req_indices",
    "seed_token_to_req_indices",
]


def seed_token_to_req_indices(self: SeedMetadata, buffer: torch.Tensor) -> torch.Tensor:
    """Build or reuse the per-token request index mapping (PR 47474's method)."""
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
    buffer[:num_mapped_tokens].copy_(torch.from_numpy(token_to_req_indices))
    if num_mapped_tokens < num_tokens:
        buffer[num_mapped_tokens:num_tokens].zero_()
    self._token_to_req_indices_cache = buffer[: max(num_mapped_tokens, num_tokens)]
    return self._token_to_req_indices_cache[:num_tokens]


@dataclasses.dataclass
class SeedMetadata:
    """The fields of vLLM's ``CommonAttentionMetadata`` the seed's method reads."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    num_actual_tokens: int
    _token_to_req_indices_cache: torch.Tensor | None = None

    token_to_req_indices = seed_token_to_req_indices


def kept_slice_token_to_req_indices(
    self: KeptSliceMetadata, buffer: torch.Tensor
) -> torch.Tensor:
    """The seed's miss, then the slice it returned, kept: a hit checks nothing."""
    kept = self._kept_slice
    if kept is None:
        kept = self._kept_slice = seed_token_to_req_indices(self, buffer)
    return kept


@dataclasses.dataclass
class KeptSliceMetadata(SeedMetadata):
    """:class:`SeedMetadata` with a slot for the slice a hit hands back."""

    _kept_slice: torch.Tensor | None = None

    token_to_req_indices = kept_slice_token_to_req_indices
