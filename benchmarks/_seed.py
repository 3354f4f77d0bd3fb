# SPDX-License-Identifier: Apache-2.0
"""The seeds' hand-written request-index cache (vLLM PR 47474), as a baseline.

Written from the PR report in ``shared/seeds``: a ``_token_to_req_indices_cache`` slot
on the step metadata; the first call computes the index with numpy and copies it into
the caller's buffer, every later call checks the cached tensor with three asserts and
returns a slice of it. On the CPU the pinned staging copy of the PR is a plain copy.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

__all__ = ["SeedMetadata", "seed_token_to_req_indices"]


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
