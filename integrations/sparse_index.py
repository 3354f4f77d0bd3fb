# SPDX-License-Identifier: Apache-2.0
"""The DSv4 FlashInfer sparse-index cache: one build per layer kind per step.

Every DeepSeek V4 attention layer running the FlashInfer sparse-MLA kernel needs the
mixed sparse indices of the batch. Within a step they depend only on the step's SWA
metadata and the layer's kind, so all SWA-only layers can share one build, and all
C128A layers another. C4A layers read their own top-k indices, which differ per layer,
so they are never cached.

Only the ``(sparse_indices, sparse_topk_lens)`` pair is cached. Whatever else a layer
derives (its own compressed KV cache, for instance) belongs to that layer and is not.

>>> import torch
>>> class SWAMetadata: pass
>>> swa = SWAMetadata()
>>> builds = []
>>> def build():
...     builds.append(1)
...     return torch.zeros(3, 4, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
>>> first = sparse_index(swa, "c128a", None, build)
>>> second = sparse_index(swa, "c128a", None, build)
>>> len(builds), first[0] is second[0]
(1, True)
>>> _ = sparse_index(swa, "c4a", None, build); _ = sparse_index(swa, "c4a", None, build)
>>> len(builds)
3
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import torch

import stepcache
from stepcache import TensorSpec

__all__ = ["CACHED_KINDS", "SparseIndexPair", "layer_kind", "sparse_index"]

SparseIndexPair = tuple[torch.Tensor, torch.Tensor]

#: Layer kinds whose sparse indices are shared by every layer of that kind in a step.
CACHED_KINDS: Final = frozenset({"swa_only", "c128a"})


def layer_kind(swa_only: bool, compress_ratio: int) -> str:
    """The layer kind as vLLM's FlashInfer backend names it.

    SWA-only layers are ``"swa_only"``; compressed layers are ``"c128a"`` at ratio 128
    and ``"c4a"`` otherwise.

    >>> layer_kind(True, 1), layer_kind(False, 128), layer_kind(False, 4)
    ('swa_only', 'c128a', 'c4a')
    """
    if swa_only:
        return "swa_only"
    return "c128a" if compress_ratio == 128 else "c4a"


@stepcache.step_cached(
    key=("kind", "num_rows"),
    # C4A layers (and any kind this module does not know) read per-layer top-k
    # indices: building once for all of them would hand every layer the first
    # layer's indices, so their calls bypass the cache
    only={"kind": CACHED_KINDS},
    owner="swa_metadata",
    expect=(
        TensorSpec(dtype=torch.int32, ndim=2),
        TensorSpec(dtype=torch.int32, ndim=1),
    ),
    name="dsv4.sparse_index",
)
def sparse_index(
    swa_metadata: object,
    kind: str,
    num_rows: int | None,
    build: Callable[..., SparseIndexPair],
    *args: Any,
) -> SparseIndexPair:
    """``build(*args)``'s ``(sparse_indices, sparse_topk_lens)``, built once per step
    for each ``(kind, num_rows)`` of the kinds in :data:`CACHED_KINDS`.

    ``swa_metadata`` is the step's SWA metadata object, which owns the entries: they
    live and die with it, and a copy of it never sees them (no dependency is declared,
    so an entry is bound to the object itself). ``num_rows`` is the row count the
    kernel call wants (``None``: the real tokens). Every other kind calls ``build()``
    each time. ``args`` are passed to ``build`` and are not part of the key (a layer
    index, say): they must not change what a cached kind builds.
    """
    return build(*args)
