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

FlashMLA's V4.1 layers make the same call from their own module, each with its own
pair of patches built from the same rule (:data:`BACKENDS`; a cache and a stats row
per patch, one run count): ``DeepseekV4FlashMLAAttention._forward_decode``
(:data:`FLASHMLA_TOPK_LAYER_NAME`, the same signature and place as SM120's) and the
Mega-attention subclass's ``_decode_compressed_kv_and_topk`` (:data:`MEGA_TOPK_
LAYER_NAME`: its own ``forward_mqa`` never reaches ``_forward_decode``; every layer's
decode calls this method once, SWA-only ones too). A named call carries its patch's
name, so only the stand-in of that module serves it.

SWA-only layers compute nothing here (their decode never calls it) and prefill rows
stay vLLM's. The SM100 backend's mixed sparse indices (``_build_sparse_index_
metadata``) are another method, patched by :mod:`~stepcache.integrations.vllm.dsv4`;
its compressed layers' are cached per run only when ``vllm.dsv41.mixed_sparse_index``
(which counts the runs in the same :data:`~stepcache.integrations.vllm.dsv4.
index_runs`) is applied too.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

import torch

from stepcache.kit import place

from ..patching import (
    MARK,
    REQUIRED,
    Patch,
    SkipPatch,
    Target,
    Verify,
    expect_dataclass_fields,
    expect_function,
)
from .dsv4 import index_runs, owned_index_cache, per_run_cache

__all__ = [
    "BACKENDS",
    "FLASHMLA_TOPK_LAYER_NAME",
    "FLASHMLA_TOPK_NAME",
    "GLOBAL_TOPK_LAYER_NAME",
    "GLOBAL_TOPK_NAME",
    "MEGA_TOPK_LAYER_NAME",
    "MEGA_TOPK_NAME",
    "PATCHES",
    "Backend",
    "runs",
]

GLOBAL_TOPK_NAME: Final = "vllm.dsv41.decode_global_topk"
GLOBAL_TOPK_LAYER_NAME: Final = "vllm.dsv41.decode_global_topk.layer"
FLASHMLA_TOPK_NAME: Final = "vllm.dsv41.flashmla_decode_global_topk"
FLASHMLA_TOPK_LAYER_NAME: Final = "vllm.dsv41.flashmla_decode_global_topk.layer"
MEGA_TOPK_NAME: Final = "vllm.dsv41.mega_attn_decode_global_topk"
MEGA_TOPK_LAYER_NAME: Final = "vllm.dsv41.mega_attn_decode_global_topk.layer"

_FUNCTION = "compute_global_topk_indices_and_lens"
_FIELD = "flashinfer_sparse_index_cache"
_SWA_MODULE = "vllm.v1.attention.backends.mla.sparse_swa"

#: the parameters of vLLM's ``_forward_decode`` (FlashInfer SM120 and FlashMLA alike)
_DECODE_PARAMS = (
    "self",
    "q",
    "kv_cache",
    "swa_metadata",
    "attn_metadata",
    "swa_only",
    "output",
)
#: the Mega-attention layer's own call site: ``(flashmla_metadata, swa_metadata)``
_MEGA_PARAMS = ("self", "flashmla_metadata", "swa_metadata")

Pair = tuple[torch.Tensor, torch.Tensor]


@dataclasses.dataclass(frozen=True)
class Backend:
    """One V4.1 backend's copy of the call: its module's binding of
    ``compute_global_topk_indices_and_lens`` (the patch ``name``) and the layer method
    that makes it once per decode (the patch ``layer_name``: ``cls.method`` with the
    parameters ``params``, ``self`` first)."""

    name: str
    layer_name: str
    module: str
    cls: str
    method: str
    params: tuple[str, ...]


FLASHINFER: Final = Backend(
    GLOBAL_TOPK_NAME,
    GLOBAL_TOPK_LAYER_NAME,
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse",
    "DeepseekV4FlashInferSM120Attention",
    "_forward_decode",
    _DECODE_PARAMS,
)
FLASHMLA: Final = Backend(
    FLASHMLA_TOPK_NAME,
    FLASHMLA_TOPK_LAYER_NAME,
    "vllm.models.deepseek_v41.nvidia.flashmla",
    "DeepseekV4FlashMLAAttention",
    "_forward_decode",
    _DECODE_PARAMS,
)
#: the Mega-attention subclass has its own forward and binds the function itself
MEGA: Final = Backend(
    MEGA_TOPK_NAME,
    MEGA_TOPK_LAYER_NAME,
    "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn",
    "DeepseekV4MegaAttnAttention",
    "_decode_compressed_kv_and_topk",
    _MEGA_PARAMS,
)
BACKENDS: Final = (FLASHINFER, FLASHMLA, MEGA)

#: the process's indexer runs, shared with the SM100 backend's patch (a run counted
#: by any backend's layers invalidates every cache)
_runs = index_runs


def runs() -> int:
    """The current run: a cached pair serves only the run it was computed in."""
    return _runs.n


#: the decode under way in this thread: (function patch, layer, SWA metadata, KV
#: source's metadata); set by a patched layer method, taken by its module's one
#: global top-k call
_decode: contextvars.ContextVar[tuple[str, Any, Any, Any] | None] = (
    contextvars.ContextVar("stepcache_dsv41_decode", default=None)
)


#: one cache per backend (each serves only its own module's function), one rule
_cached: Final = {
    backend.name: per_run_cache(
        backend.name, ("token_to_req_indices", "is_valid_token")
    )
    for backend in BACKENDS
}


def _serve(name: str, compute: Callable[..., Pair], args: tuple[Any, ...]) -> Pair:
    """The patch ``name``'s call of ``compute(*args)`` (vLLM's function): cached per
    run and step when a layer method patched for ``name`` made it, else vLLM's."""
    call = _decode.get()
    if call is None or call[0] != name:  # not named for this module's function
        return compute(*args)
    _decode.set(None)  # one call per decode: any later one is vLLM's
    _, layer, swa_metadata, attn_metadata = call
    topk_indices, token_to_req_indices, block_table, block_size, is_valid_token = args
    buffer = getattr(layer, "topk_indices_buffer", None)
    table = getattr(attn_metadata, "block_table", None)
    if (
        token_to_req_indices is not swa_metadata.token_to_req_indices
        or not isinstance(buffer, torch.Tensor)
        or not isinstance(table, torch.Tensor)
    ):  # not the call the method was checked to make: vLLM's, uncached
        return compute(*args)
    layout = (
        place(topk_indices),
        place(block_table),
        block_size,
        place(is_valid_token),
    )
    pair: Pair = _cached[name](
        swa_metadata,
        layout,
        _runs.n,
        owned_index_cache(swa_metadata).token,
        buffer,
        table,
        compute,
        args,
    )
    return pair


def _stand_in(name: str, original: Callable[..., Pair]) -> Callable[..., Pair]:
    """What replaces ``original`` in the module of the patch ``name``."""

    def compute_global_topk_indices_and_lens(
        topk_indices: torch.Tensor,
        token_to_req_indices: torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        is_valid_token: torch.Tensor,
    ) -> Pair:
        args = (
            topk_indices,
            token_to_req_indices,
            block_table,
            block_size,
            is_valid_token,
        )
        return _serve(name, original, args)

    compute_global_topk_indices_and_lens.__doc__ = original.__doc__
    return compute_global_topk_indices_and_lens


def _find_function(backend: Backend, module: ModuleType) -> Target:
    params = (
        ("topk_indices", REQUIRED),
        ("token_to_req_indices", REQUIRED),
        ("block_table", REQUIRED),
        ("block_size", REQUIRED),
        ("is_valid_token", REQUIRED),
    )
    original = expect_function(module, _FUNCTION, params)
    _layer_class(backend, module)  # the caller it serves must be there too
    return Target(module, _FUNCTION, original, _stand_in(backend.name, original))


def _layer_class(backend: Backend, module: ModuleType) -> type:
    cls = getattr(module, backend.cls, None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.{backend.cls} is absent")
    method = getattr(cls, backend.method, None)
    if getattr(method, MARK, None) == backend.layer_name:  # ours: vLLM's within
        method = getattr(method, "__wrapped__", None)
    code = getattr(method, "__code__", None)
    # the method must still make the call the stand-in serves
    if code is None or _FUNCTION not in code.co_names:
        raise SkipPatch(
            f"{module.__name__}.{backend.cls}.{backend.method} does not call "
            f"{_FUNCTION}"
        )
    return cls


def _find_layer(backend: Backend, module: ModuleType) -> Target:
    cls = _layer_class(backend, module)
    params = tuple((p, REQUIRED) for p in backend.params)
    original = expect_function(cls, backend.method, params)
    swa_module = sys.modules.get(_SWA_MODULE)
    if swa_module is None:
        raise SkipPatch(f"{module.__name__} is imported but {_SWA_MODULE} is not")
    expect_dataclass_fields(
        getattr(swa_module, "DeepseekSparseSWAMetadata", None),
        (_FIELD, "token_to_req_indices", "is_valid_token"),
    )
    wrapper: Callable[..., Any]
    if backend.params == _DECODE_PARAMS:
        wrapper = _decode_wrapper(backend.name, original)
    else:
        wrapper = _mega_wrapper(backend.name, original)
    wrapper.__qualname__ = f"{backend.cls}.{backend.method}"
    wrapper.__doc__ = original.__doc__
    wrapper.__wrapped__ = original  # type: ignore[union-attr]
    return Target(cls, backend.method, original, wrapper)


def _decode_wrapper(name: str, original: Callable[..., None]) -> Callable[..., None]:
    """``_forward_decode`` (FlashInfer SM120, FlashMLA): counts the run, names the
    call of a compressed layer."""
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
        named = _decode.set((name, self, swa_metadata, attn_metadata))
        try:
            original(self, q, kv_cache, swa_metadata, attn_metadata, swa_only, output)
        finally:
            _decode.reset(named)

    return _forward_decode


Triple = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def _mega_wrapper(name: str, original: Callable[..., Triple]) -> Callable[..., Triple]:
    """``_decode_compressed_kv_and_topk`` (Mega attention): called once by every
    layer's decode, SWA-only ones too (which return at once), so it counts the run
    and names the call."""
    runs_now = _runs
    missing = object()

    def _decode_compressed_kv_and_topk(
        self: Any, flashmla_metadata: Any, swa_metadata: Any
    ) -> Triple:
        if getattr(self, "indexer", missing) is not None:  # as _forward_decode's
            runs_now.n += 1
        named = _decode.set((name, self, swa_metadata, flashmla_metadata))
        try:
            return original(self, flashmla_metadata, swa_metadata)
        finally:
            _decode.reset(named)

    return _decode_compressed_kv_and_topk


#: Two patches per backend, both off by default (no GPU has timed a hit against the
#: kernel launch it saves): its layer method, which counts the runs and names the
#: call, and its module's function, cached only with the first applied as well
PATCHES: Final = tuple(
    patch
    for b in BACKENDS
    for patch in (
        Patch(b.layer_name, b.module, functools.partial(_find_layer, b), opt_in=True),
        Patch(
            b.name,
            b.module,
            functools.partial(_find_function, b),
            Verify(),
            opt_in=True,
        ),
    )
)
