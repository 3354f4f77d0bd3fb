# SPDX-License-Identifier: Apache-2.0
"""vLLM's DeepSeek V4 caches and builders, replaced or decorated with stepcache.

* The FlashInfer sparse-index cache: ``DeepseekV4FlashInferMLAAttention.
  _build_sparse_index_metadata`` keeps a per-step dict on the SWA metadata. The patch
  silences that dict and routes the index builder that the method calls (the
  module's ``build_flashinfer_mixed_sparse_indices``) through
  :func:`stepcache.integrations.sparse_index.sparse_index`, keyed by the calling
  layer's kind and row count. The method's other results (the layer's own compressed
  KV cache, the sequence lengths) are still computed by vLLM's code on every call.
* ``_get_c128_boundary``: a pure function of the batch layout that every DSv4
  compressor builder of a step computes again (a Python loop over the requests).
"""

from __future__ import annotations

import contextvars
import functools
from types import ModuleType
from typing import Any

import torch

import stepcache

from ._vllm_patch import (
    REQUIRED,
    SkipPatch,
    Undo,
    expect_dataclass_fields,
    expect_function,
    marked,
    replace_attribute,
)
from .sparse_index import (
    SparseIndexPair,
    layer_kind,
    sparse_index,
)

__all__ = [
    "C128_BOUNDARY_NAME",
    "SPARSE_INDEX_NAME",
    "apply_c128_boundary",
    "apply_sparse_index",
    "build_sparse_index_metadata",
    "get_c128_boundary",
    "routed_index_builder",
]

SPARSE_INDEX_NAME = "vllm.dsv4.flashinfer_sparse_index"
C128_BOUNDARY_NAME = "vllm.dsv4._get_c128_boundary"

_original: dict[str, Any] = {}

#: (swa_metadata, layer kind, num_rows) of the _build_sparse_index_metadata call
#: running in this context, until its index build has been routed
_Route = tuple[object, str, int | None]
_route: contextvars.ContextVar[_Route | None] = contextvars.ContextVar(
    "stepcache_dsv4_sparse_route", default=None
)


class _NoCache(dict[str, SparseIndexPair]):
    """Stands in for vLLM's per-step dict: it never holds anything, so vLLM's lookup
    always misses and its build goes to the routed builder (stepcache's cache)."""

    def get(self, key: str, default: Any = None) -> Any:
        return default

    def __setitem__(self, key: str, value: SparseIndexPair) -> None:
        return None


_NO_CACHE = _NoCache()


def build_sparse_index_metadata(
    self: Any,
    kv_cache: torch.Tensor | None,
    swa_k_cache: torch.Tensor,
    swa_metadata: Any,
    attn_metadata: Any,
    swa_only: bool,
    num_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ``_build_sparse_index_metadata``, with stepcache's sparse-index cache."""
    if type(swa_metadata.flashinfer_sparse_index_cache) is not _NoCache:
        swa_metadata.flashinfer_sparse_index_cache = _NO_CACHE
    route = (swa_metadata, layer_kind(swa_only, self.compress_ratio), num_rows)
    token = _route.set(route)
    try:
        result: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] = (
            _original["method"](
                self,
                kv_cache=kv_cache,
                swa_k_cache=swa_k_cache,
                swa_metadata=swa_metadata,
                attn_metadata=attn_metadata,
                swa_only=swa_only,
                num_rows=num_rows,
            )
        )
        return result
    finally:
        _route.reset(token)


def routed_index_builder(*args: Any, **kwargs: Any) -> SparseIndexPair:
    """vLLM's ``build_flashinfer_mixed_sparse_indices``; a call from inside
    :func:`build_sparse_index_metadata` goes through stepcache's cache."""
    builder = _original["builder"]
    route = _route.get()
    if route is None:
        pair: SparseIndexPair = builder(*args, **kwargs)
        return pair
    _route.set(None)  # one build per method call: a second one is not the same
    swa_metadata, kind, num_rows = route
    return sparse_index(
        swa_metadata, kind, num_rows, functools.partial(builder, *args, **kwargs)
    )


@stepcache.step_cached(
    depends_on=("query_start_loc_cpu", "seq_lens_cpu_upper_bound"),
    name=C128_BOUNDARY_NAME,
)
def get_c128_boundary(metadata: Any) -> bool | None:
    """vLLM's ``_get_c128_boundary(metadata)``, once per layout."""
    result: bool | None = _original["c128_boundary"](metadata)
    return result


def apply_sparse_index(module: ModuleType) -> Undo:
    """Route the FlashInfer DSv4 sparse-index build through stepcache."""
    cls = getattr(module, "DeepseekV4FlashInferMLAAttention", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.DeepseekV4FlashInferMLAAttention is absent")
    method = expect_function(
        cls,
        "_build_sparse_index_metadata",
        (
            ("self", REQUIRED),
            ("kv_cache", REQUIRED),
            ("swa_k_cache", REQUIRED),
            ("swa_metadata", REQUIRED),
            ("attn_metadata", REQUIRED),
            ("swa_only", REQUIRED),
            ("num_rows", None),
        ),
    )
    builder = getattr(module, "build_flashinfer_mixed_sparse_indices", None)
    if not callable(builder):
        raise SkipPatch(
            f"{module.__name__}.build_flashinfer_mixed_sparse_indices is absent"
        )
    swa_module = _imported(module, "vllm.v1.attention.backends.mla.sparse_swa")
    expect_dataclass_fields(
        getattr(swa_module, "DeepseekSparseSWAMetadata", None),
        ("flashinfer_sparse_index_cache",),
    )
    _original["method"] = method
    _original["builder"] = builder
    undo_method = replace_attribute(
        cls,
        "_build_sparse_index_metadata",
        marked(build_sparse_index_metadata, SPARSE_INDEX_NAME),
    )
    undo_builder = replace_attribute(
        module,
        "build_flashinfer_mixed_sparse_indices",
        marked(routed_index_builder, SPARSE_INDEX_NAME),
    )

    def undo() -> None:
        undo_builder()
        undo_method()

    return undo


def apply_c128_boundary(module: ModuleType) -> Undo:
    """Decorate the DSv4 compressor module's ``_get_c128_boundary``."""
    original = expect_function(module, "_get_c128_boundary", (("metadata", REQUIRED),))
    _original["c128_boundary"] = original
    return replace_attribute(
        module, "_get_c128_boundary", marked(get_c128_boundary, C128_BOUNDARY_NAME)
    )


def _imported(module: ModuleType, name: str) -> ModuleType:
    import sys

    found = sys.modules.get(name)
    if found is None:
        raise SkipPatch(f"{module.__name__} is imported but {name} is not")
    return found
