# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4.1's decode global top-k, once per index-source run (off by default).

DeepSeek V4.1 shares one ``topk_indices_buffer`` between its layers: the indexer of
an index-source layer rewrites it in place (a Triton kernel or a custom op, which
move no torch version counter), and every compressed layer after it maps the buffer's
local indices to global KV slots. On FlashInfer's SM120 backend
(``DeepseekV4FlashInferSM120Attention._forward_decode``, ``models/deepseek_v41/nvidia/
flashinfer_sparse.py``) each compressed layer does that in decode with
``compute_global_topk_indices_and_lens(topk_buffer[:num_decode_tokens],
swa_metadata.token_to_req_indices, attn_metadata.block_table[:num_decodes],
attn_metadata.block_size // compress_ratio, swa_metadata.is_valid_token[:n])``: two
allocations and a kernel launch per layer, while the value depends only on the
buffer as the last indexer left it, the step's SWA metadata and the KV source's block
table and block size. Layers that share an index source and a KV source (and so a
compress ratio) compute it again and again.

Two patches, both off by default (``STEPCACHE_VLLM_ADD`` names both):

* :data:`GLOBAL_TOPK_LAYER_NAME` wraps the layer's ``_forward_decode``. It starts a
  new *run* (a process-wide count) whenever the layer has an indexer: the layer's
  indexer wrote the buffer earlier in the same layer call (``_sparse_indexer_and_attn``
  runs ``indexer_op`` before ``forward_mqa``, in every graph mode; the short-context
  fill runs before both), and no other layer reads the buffer in between. Nothing
  here assumes which source a consumer belongs to, or in which order layers run: a
  value is reused only while no indexer-owning layer has decoded since it was
  computed. It then names the call (layer, SWA metadata, KV source's metadata) for
  the one global top-k computation its decode makes.
* :data:`GLOBAL_TOPK_NAME` replaces the module's ``compute_global_topk_indices_and_
  lens``. Called inside such a decode, it caches the pair in the step's SWA metadata
  object (:func:`stepcache.step_cached`, so it dies with the step), keyed by the
  call's own arguments (addresses, shapes, strides, block size) and depending on the
  run, on a token that vLLM's ``flashinfer_sparse_index_cache.clear()`` renews (its
  draft steps rewrite ``token_to_req_indices`` and ``is_valid_token`` in place, then
  clear that dict: :class:`~stepcache.integrations.vllm.dsv4.TokenedIndexCache`), and
  on the tensors it reads. Any other call (prefill, a caller outside a patched decode,
  either patch left out) is vLLM's function as found.

SWA-only layers compute nothing here (their decode never calls it) and prefill rows
stay vLLM's. The SM100 backend's mixed sparse indices (``_build_sparse_index_
metadata``) are another method, patched by :mod:`~stepcache.integrations.vllm.dsv4`;
its compressed layers' are cached per run only when ``vllm.dsv41.mixed_sparse_index``
(which counts the runs in the same :data:`~stepcache.integrations.vllm.dsv4.
index_runs`) is applied too.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import torch

import stepcache
from stepcache.kit import place

from ..patching import (
    MARK,
    REQUIRED,
    SkipPatch,
    Target,
    expect_dataclass_fields,
    expect_function,
)
from .dsv4 import OwnedIndexCache, TokenedIndexCache, index_runs

__all__ = [
    "GLOBAL_TOPK_LAYER_NAME",
    "GLOBAL_TOPK_NAME",
    "find_decode_global_topk",
    "find_decode_layer",
    "runs",
    "stock_global_topk",
]

GLOBAL_TOPK_NAME: Final = "vllm.dsv41.decode_global_topk"
GLOBAL_TOPK_LAYER_NAME: Final = "vllm.dsv41.decode_global_topk.layer"

_FUNCTION = "compute_global_topk_indices_and_lens"
_CLASS = "DeepseekV4FlashInferSM120Attention"
_METHOD = "_forward_decode"
_FIELD = "flashinfer_sparse_index_cache"
_SWA_MODULE = "vllm.v1.attention.backends.mla.sparse_swa"

Pair = tuple[torch.Tensor, torch.Tensor]

#: vLLM's functions, kept by the patches that call them
_original: dict[str, Callable[..., Any]] = {}


#: the process's indexer runs, shared with the SM100 backend's patch (a run counted
#: by either backend's layers invalidates both caches)
_runs = index_runs


def runs() -> int:
    """The current run: a cached pair serves only the run it was computed in."""
    return _runs.n


#: the decode under way in this thread: (layer, SWA metadata, KV source's metadata);
#: set by the layer's patched decode, taken by its one global top-k call
_decode: contextvars.ContextVar[tuple[Any, Any, Any] | None] = contextvars.ContextVar(
    "stepcache_dsv41_decode", default=None
)


def _token(swa_metadata: Any) -> int:
    """The token of ``swa_metadata``'s own sparse-index dict, renewed by vLLM's
    ``clear()``. A dict that is not its own tokened one is replaced; the pairs of one
    bound to it (the DSv4 patch's) are kept, a plain dict's are not (they may be
    another object's, carried over by ``dataclasses.replace``)."""
    cache = getattr(swa_metadata, _FIELD)
    if cache.__class__ is TokenedIndexCache and cache.owner() is swa_metadata:
        token: int = cache.token
        return token
    fresh = TokenedIndexCache(swa_metadata)
    if isinstance(cache, OwnedIndexCache) and cache.owner() is swa_metadata:
        fresh.update(cache)
    setattr(swa_metadata, _FIELD, fresh)
    return fresh.token


@stepcache.step_cached(
    key="layout",
    owner="swa_metadata",
    # the run: no indexer has rewritten the buffer since; the token: vLLM has not
    # cleared the step's dict (a draft step's rewrite); the tensors read, as objects
    depends_on=(
        "run",
        "token",
        "buffer",
        "table",
        "token_to_req_indices",
        "is_valid_token",
    ),
    ignore=("compute", "args"),
    name=GLOBAL_TOPK_NAME,
)
def _cached_pair(
    swa_metadata: Any,
    layout: tuple[object, ...],
    run: int,
    token: int,
    buffer: torch.Tensor,
    table: torch.Tensor,
    compute: Callable[..., Pair],
    args: tuple[Any, ...],
) -> Pair:
    return compute(*args)


def stock_global_topk(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
) -> Pair:
    """vLLM's function as the patch found it (verify mode's stock value)."""
    result: Pair = _original[GLOBAL_TOPK_NAME](
        topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
    )
    return result


def global_topk(
    topk_indices: torch.Tensor,
    token_to_req_indices: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    is_valid_token: torch.Tensor,
) -> Pair:
    """vLLM's ``compute_global_topk_indices_and_lens``, cached per run and step when
    called by a patched layer's decode (see the module's docstring)."""
    call = _decode.get()
    if call is None:
        return stock_global_topk(
            topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
        )
    _decode.set(None)  # one call per decode: any later one is vLLM's
    layer, swa_metadata, attn_metadata = call
    buffer = layer.topk_indices_buffer
    table = attn_metadata.block_table
    args = (topk_indices, token_to_req_indices, block_table, block_size, is_valid_token)
    if (
        token_to_req_indices is not swa_metadata.token_to_req_indices
        or not isinstance(buffer, torch.Tensor)
        or not isinstance(table, torch.Tensor)
    ):  # not the call the decode was checked to make: vLLM's, uncached
        return stock_global_topk(*args)
    layout = (
        place(topk_indices),
        place(block_table),
        block_size,
        place(is_valid_token),
    )
    return _cached_pair(
        swa_metadata,
        layout,
        _runs.n,
        _token(swa_metadata),
        buffer,
        table,
        stock_global_topk,
        args,
    )


def find_decode_global_topk(module: ModuleType) -> Target:
    """The FlashInfer V4.1 module's ``compute_global_topk_indices_and_lens``, replaced
    by :func:`global_topk`."""
    params = (
        ("topk_indices", REQUIRED),
        ("token_to_req_indices", REQUIRED),
        ("block_table", REQUIRED),
        ("block_size", REQUIRED),
        ("is_valid_token", REQUIRED),
    )
    original = expect_function(module, _FUNCTION, params)
    _decode_method(module)  # the caller it serves must be there too
    _original[GLOBAL_TOPK_NAME] = original
    return Target(module, _FUNCTION, original, global_topk)


def _decode_method(module: ModuleType) -> type:
    cls = getattr(module, _CLASS, None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.{_CLASS} is absent")
    method = getattr(cls, _METHOD, None)
    if getattr(method, MARK, None) == GLOBAL_TOPK_LAYER_NAME:  # ours: vLLM's within
        method = getattr(method, "__wrapped__", None)
    code = getattr(method, "__code__", None)
    # the decode must still make the call the stand-in serves
    if code is None or _FUNCTION not in code.co_names:
        raise SkipPatch(
            f"{module.__name__}.{_CLASS}.{_METHOD} does not call {_FUNCTION}"
        )
    return cls


def find_decode_layer(module: ModuleType) -> Target:
    """``DeepseekV4FlashInferSM120Attention._forward_decode``, wrapped to count the
    indexer runs and name the decode for :func:`global_topk`."""
    cls = _decode_method(module)
    params = (
        ("self", REQUIRED),
        ("q", REQUIRED),
        ("kv_cache", REQUIRED),
        ("swa_metadata", REQUIRED),
        ("attn_metadata", REQUIRED),
        ("swa_only", REQUIRED),
        ("output", REQUIRED),
    )
    original = expect_function(cls, _METHOD, params)
    swa_module = sys.modules.get(_SWA_MODULE)
    if swa_module is None:
        raise SkipPatch(f"{module.__name__} is imported but {_SWA_MODULE} is not")
    expect_dataclass_fields(
        getattr(swa_module, "DeepseekSparseSWAMetadata", None),
        (_FIELD, "token_to_req_indices", "is_valid_token"),
    )
    _original[GLOBAL_TOPK_LAYER_NAME] = original
    runs_now = _runs
    missing = object()

    def _forward_decode(
        self: Any,
        q: torch.Tensor,
        kv_cache: torch.Tensor | None,
        swa_metadata: Any,
        attn_metadata: Any,
        swa_only: bool,
        output: torch.Tensor,
    ) -> None:
        # an indexer-owning layer has just rewritten the buffer (a layer without the
        # attribute counts as one: never a stale hit)
        if getattr(self, "indexer", missing) is not None:
            runs_now.n += 1
        if swa_only:
            original(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output)
            return
        named = _decode.set((self, swa_metadata, attn_metadata))
        try:
            original(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output)
        finally:
            _decode.reset(named)

    _forward_decode.__qualname__ = f"{_CLASS}.{_METHOD}"
    _forward_decode.__doc__ = original.__doc__
    _forward_decode.__wrapped__ = original  # type: ignore[attr-defined]
    return Target(cls, _METHOD, original, _forward_decode)
