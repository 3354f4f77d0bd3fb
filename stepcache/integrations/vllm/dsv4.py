# SPDX-License-Identifier: Apache-2.0
"""vLLM's DeepSeek V4 and V4.1 step caches, cached by stepcache.

* The FlashInfer sparse-index cache. ``DeepseekV4FlashInferMLAAttention.
  _build_sparse_index_metadata`` (DeepSeek V4 and, in its own module, V4.1) keeps the
  step's ``(sparse_indices, sparse_topk_lens)`` pairs in a dict on the step's SWA
  metadata, ``flashinfer_sparse_index_cache``: the first layer of a kind builds, the
  others of that kind read the dict, and vLLM empties it with ``clear()`` when it
  rewrites the metadata in place for a draft step. Stock's dict is a dataclass field,
  which ``dataclasses.replace()`` and ``copy.copy`` hand, with its pairs, to metadata
  describing other tokens. The plugin binds the dict to one metadata object
  (:class:`TokenedIndexCache`: a dict bound to another object is replaced by a fresh
  one) and gives it a token that each ``clear()`` renews. The pairs are a stepcache
  cache in every mode (:func:`_cached_pair`, named in :func:`stepcache.stats`): an
  entry per layer kind (and row count) on the metadata object, depending on the
  dict's token, so vLLM's ``clear()`` is honoured. A miss runs vLLM's method as is,
  which builds with the module's ``build_flashinfer_mixed_sparse_indices`` looked up
  when it runs (a test's fake put there, before or after the plugin loads, is what
  builds) and fills the dict. A hit returns what vLLM's method returns when the dict
  holds the pair (the layer's cache tensor, the requests' ``seq_lens`` and the pair),
  without the rest of its work, which serves only a build. C4A layers, whose indices
  are their own, are vLLM's alone.
* V4.1's compressed layers (SM100), off by default (:data:`MIXED_SPARSE_NAME`, which
  wraps ``forward_mqa``): their mixed sparse indices depend on the shared
  ``topk_indices_buffer`` as the last index source's indexer left it (a kernel's
  write, no version counter), so each is cached per *indexer run*
  (:data:`index_runs`, counted by the wrapper whenever an indexer-owning layer runs)
  and dict token, keyed by the layer's ratio and window, the buffer's and the KV
  source's block table's storage and layout, and the caches' strides. Only the one
  build a patched ``forward_mqa`` makes is served; any other call is vLLM's.
* ``_get_c128_boundary``: a pure function of the batch layout that every DSv4
  compressor builder of a step computes again (a Python loop over the requests),
  computed once per build by :func:`stepcache.step_cached`.
"""

from __future__ import annotations

import contextvars
import copy
import inspect
import itertools
import sys
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

import stepcache
from stepcache.kit import place

from ..dsv4.sparse_index import PAIR_SPEC
from ..patching import (
    REQUIRED,
    SkipPatch,
    Target,
    counters,
    expect_dataclass_fields,
    expect_function,
)

__all__ = [
    "C128_BOUNDARY_NAME",
    "MIXED_SPARSE_NAME",
    "SPARSE_INDEX_NAME",
    "SPARSE_INDEX_V41_NAME",
    "TokenedIndexCache",
    "find_c128_boundary",
    "find_mixed_sparse_layer",
    "find_sparse_index",
    "find_sparse_index_v41",
    "get_c128_boundary",
    "index_runs",
    "owned_index_cache",
    "per_run_cache",
    "stock_c128_boundary",
    "stock_sparse_index",
    "stock_sparse_index_v41",
]

SPARSE_INDEX_NAME = "vllm.dsv4.flashinfer_sparse_index"
SPARSE_INDEX_V41_NAME = "vllm.dsv41.flashinfer_sparse_index"
C128_BOUNDARY_NAME = "vllm.dsv4._get_c128_boundary"
MIXED_SPARSE_NAME = "vllm.dsv41.mixed_sparse_index"

_FIELD = "flashinfer_sparse_index_cache"
_SWA_MODULE = "vllm.v1.attention.backends.mla.sparse_swa"

#: vLLM's functions, kept by the patches that call them
_original: dict[str, Any] = {}

Result = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


#: one token per dict and per clear(): an int, compared by value (the cheapest
#: fingerprint), never the same twice in a process
_tokens = itertools.count()


class TokenedIndexCache(dict[str, tuple[torch.Tensor, torch.Tensor]]):
    """vLLM's per-step sparse-index dict, bound to the metadata object it serves, with
    a ``token`` that a new dict or ``clear()`` renews: what the cached pairs depend on
    (:func:`_cached_pair`).

    A plain ``dict`` to vLLM's code, which reads it with ``get``, fills it with
    ``[key] = pair`` and empties it with ``clear()``.
    """

    __slots__ = ("_owner", "token")

    def __init__(self, owner: object) -> None:
        super().__init__()
        try:
            self._owner: Callable[[], object] = weakref.ref(owner)
        except TypeError:  # an owner without weak references: keep it alive
            self._owner = lambda: owner
        self.token = next(_tokens)

    def owner(self) -> object:
        """The metadata object the dict belongs to (``None`` once it is gone)."""
        return self._owner()

    def clear(self) -> None:
        dict.clear(self)  # not super(): a draft step's call, kept cheap
        self.token = next(_tokens)  # the pairs of the dict before no longer serve


def owned_index_cache(swa_metadata: Any) -> TokenedIndexCache:
    """``swa_metadata``'s own sparse-index dict, installed on its field: the dict
    there if it belongs to ``swa_metadata``, else a fresh one. The pairs of any other
    dict may describe other tokens: one bound to another object was carried over by
    ``dataclasses.replace()`` or ``copy.copy``, and so may be a plain dict vLLM put
    there before the plugin loaded."""
    cache = getattr(swa_metadata, _FIELD)
    if isinstance(cache, TokenedIndexCache) and cache.owner() is swa_metadata:
        return cache
    owned = TokenedIndexCache(swa_metadata)
    setattr(swa_metadata, _FIELD, owned)
    return owned


class IndexRuns:
    """How many indexer-owning DeepSeek V4.1 layers have run their attention in this
    process: each one rewrote the shared ``topk_indices_buffer`` just before (its
    indexer runs ahead of its attention in the same layer call), so a value computed
    from that buffer serves only the run it was computed in. Shared by every patch
    that caches such a value, whatever backend counts."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0


#: the process's count (:class:`IndexRuns`)
index_runs = IndexRuns()

#: the V4.1 SM100 layer whose patched ``forward_mqa`` is under way in this thread,
#: set by :data:`MIXED_SPARSE_NAME`'s wrapper and taken by the layer's one sparse-index
#: build: only that build's compressed pair is cached
_mixed_call: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "stepcache_dsv41_mixed_sparse", default=None
)


def _v4_key(self: Any, swa_only: bool, num_rows: int | None) -> str | None:
    """The key vLLM 0.33's DeepSeek V4 method uses (``None``: the call does not
    cache, C4A layers)."""
    if swa_only:
        key = "swa_only"
    elif self.compress_ratio == 128:
        key = "c128a"
    else:
        return None
    return key if num_rows is None else f"{key}:{num_rows}"


def _v41_key(self: Any, swa_only: bool, num_rows: int | None) -> str | None:
    """The key of vLLM 0.33's DeepSeek V4.1 method: only SWA-only layers cache."""
    return "swa_only" if swa_only else None


def _cached_pair(name: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The stepcache cache of one version's pairs (its stats row is ``name``)."""

    @stepcache.step_cached(
        key="key",
        owner="swa_metadata",
        # a new dict (after vLLM's clear(), or on another metadata object): new pairs
        depends_on=("token",),
        # the layer and its call: every layer of a kind builds the same pair
        ignore=("method", "layer", "args", "built"),
        expect=PAIR_SPEC,
        name=name,
    )
    def sparse_pair(
        swa_metadata: Any,
        key: str,
        token: int,
        method: Any,
        layer: Any,
        args: tuple[Any, ...],
        built: list[Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(sparse_indices, sparse_topk_lens)`` of layer kind ``key`` (with its
        row count) for the dict whose ``token`` is given, built by vLLM's ``method``
        called with ``layer`` and ``args`` and that dict emptied of ``key`` (so it
        builds); the method's whole result goes to ``built``."""
        getattr(swa_metadata, _FIELD).pop(key, None)
        result = built[0] = method(layer, *args)
        return result[2], result[3]

    return sparse_pair


#: what a V4.1 compressed layer's mixed sparse indices read from the step's SWA
#: metadata (vLLM's draft steps rewrite some in place, then clear() the dict: the
#: token; the rest is named so that any other rewrite torch sees recomputes too)
_MIXED_READS = (
    "num_decodes",
    "num_prefills",
    "num_decode_tokens",
    "num_prefill_tokens",
    "seq_lens",
    "query_start_loc",
    "token_to_req_indices",
    "decode_swa_indices",
    "decode_swa_width",
    "block_table",
    "block_size",
    "is_valid_token",
    "replay_start",
)


def per_run_cache(
    name: str, reads: tuple[str, ...] = (), expect: Any = None
) -> Callable[..., Any]:
    """The cache (stats row ``name``) of a value computed from the shared
    ``topk_indices_buffer``: ``cached(swa_metadata, layout, run, token, buffer, table,
    compute, args)`` returns ``compute(*args)``, kept on the step's SWA metadata per
    ``layout`` (the key: what else the computation reads) while the run is the same
    (no indexer has rewritten the buffer since: a kernel's write, which no version
    counter shows), the dict token too (vLLM has not cleared the step's dict: a draft
    step's rewrite), the buffer and the KV source's block table are the same objects,
    and so are the SWA metadata's fields ``reads``."""

    @stepcache.step_cached(
        key="layout",
        owner="swa_metadata",
        depends_on=("run", "token", "buffer", "table", *reads),
        ignore=("compute", "args"),
        expect=expect,
        name=name,
    )
    def cached(
        swa_metadata: Any,
        layout: tuple[object, ...],
        run: int,
        token: int,
        buffer: torch.Tensor,
        table: torch.Tensor,
        compute: Callable[..., Any],
        args: tuple[Any, ...],
    ) -> Any:
        return compute(*args)

    return cached


_mixed_pair = per_run_cache(MIXED_SPARSE_NAME, _MIXED_READS, PAIR_SPEC)


def _built_pair(
    method: Any, layer: Any, args: tuple[Any, ...], built: list[Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A compressed layer's ``(sparse_indices, sparse_topk_lens)``, built by vLLM's
    ``method`` (its whole result goes to ``built``). The layers of one key build the
    same pair: their caches enter only through their strides, in the key."""
    result = built[0] = method(layer, *args)
    return result[2], result[3]


def _mixed_sparse_index(
    layer: Any,
    kv_cache: torch.Tensor | None,
    swa_k_cache: torch.Tensor,
    swa_metadata: Any,
    attn_metadata: Any,
    token: int,
    stock: Callable[..., Result],
) -> Result | None:
    """A V4.1 compressed layer's build within its patched ``forward_mqa``, cached per
    indexer run (:data:`MIXED_SPARSE_NAME`); ``None`` when the call is not the one the
    wrapper expects (vLLM's method then runs, uncached)."""
    buffer = getattr(layer, "topk_indices_buffer", None)
    table = getattr(attn_metadata, "block_table", None)
    if not (
        isinstance(kv_cache, torch.Tensor)
        and isinstance(swa_k_cache, torch.Tensor)
        and isinstance(buffer, torch.Tensor)
        and isinstance(table, torch.Tensor)
    ):
        return None
    # Everything else the build reads: the layer's ratio and window, the buffer's and
    # the block table's storage and layout, the block size, and the caches' strides
    # (the indices are storage offsets, which only the strides set, not where the
    # cache lies: vLLM's own SWA-only entry serves layers with other caches alike).
    layout = (
        layer.compress_ratio,
        layer.window_size,
        place(buffer),
        place(table),
        attn_metadata.block_size,
        kv_cache.dtype,
        kv_cache.stride(),
        swa_k_cache.dtype,
        swa_k_cache.stride(),
    )
    built: list[Any] = [None]
    args = (kv_cache, swa_k_cache, swa_metadata, attn_metadata, False, None)
    pair = _mixed_pair(
        swa_metadata,
        layout,
        index_runs.n,
        token,
        buffer,
        table,
        _built_pair,
        (stock, layer, args, built),
    )
    if built[0] is not None:  # computed in this call: vLLM's whole result
        return built[0]  # type: ignore[no-any-return]
    num_reqs = swa_metadata.num_decodes + swa_metadata.num_prefills
    return kv_cache, swa_metadata.seq_lens[:num_reqs], pair[0], pair[1]


def _sparse_index_method(
    name: str,
    original: Callable[..., Result],
    key_of: Callable[[Any, bool, int | None], str | None],
    has_num_rows: bool,
) -> Callable[..., Result]:
    sparse_pair = _cached_pair(name)
    stock = original
    if not has_num_rows:  # V4.1's method has no num_rows: called as V4's is

        def stock(self: Any, *params: Any) -> Result:
            return original(self, *params[:-1])

    def _build_sparse_index_metadata(
        self: Any,
        kv_cache: torch.Tensor | None,
        swa_k_cache: torch.Tensor,
        swa_metadata: Any,
        attn_metadata: Any,
        swa_only: bool,
        num_rows: int | None = None,
    ) -> Result:
        cache = swa_metadata.flashinfer_sparse_index_cache
        # owned_index_cache's own test, inline: the step's dict makes no call of ours
        if (
            cache.__class__ is not TokenedIndexCache
            or cache.owner() is not swa_metadata
        ):
            cache = owned_index_cache(swa_metadata)
        key = key_of(self, swa_only, num_rows)
        pair: tuple[torch.Tensor, torch.Tensor] | None = None
        if key is None:
            # V4.1's compressed layers: cached per indexer run when the layer's
            # patched forward_mqa made this call (MIXED_SPARSE_NAME, off by default)
            if not has_num_rows and _mixed_call.get() is self:
                _mixed_call.set(None)  # its one build: any later call is vLLM's
                mixed = _mixed_sparse_index(
                    self,
                    kv_cache,
                    swa_k_cache,
                    swa_metadata,
                    attn_metadata,
                    cache.token,
                    stock,
                )
                if mixed is not None:
                    return mixed
            # C4A and the rest: vLLM builds, every call
            counters.count(name, "uncached")
        else:
            built: list[Any] = [None]
            args = (
                kv_cache,
                swa_k_cache,
                swa_metadata,
                attn_metadata,
                swa_only,
                num_rows,
            )
            pair = sparse_pair(swa_metadata, key, cache.token, stock, self, args, built)
            if built[0] is not None:  # computed in this call: vLLM's whole result
                return built[0]  # type: ignore[no-any-return]
            cache[key] = pair  # vLLM's dict holds what stock's would
        if pair is None or (not swa_only and kv_cache is None):
            # vLLM's method: C4A, a miss (it builds and fills the dict), or a C128A
            # layer without its kv_cache (vLLM's own assertion says what is wrong)
            return stock(
                self,
                kv_cache,
                swa_k_cache,
                swa_metadata,
                attn_metadata,
                swa_only,
                num_rows,
            )
        # A hit: what vLLM's method returns when its dict holds the pair (the layer's
        # cache and the requests' lengths beside it), without its other work, which
        # only a build uses. tests/vllm_plugin compares it with stock's.
        num_reqs = swa_metadata.num_decodes + swa_metadata.num_prefills
        compressed = kv_cache if not swa_only and kv_cache is not None else swa_k_cache
        return compressed, swa_metadata.seq_lens[:num_reqs], pair[0], pair[1]

    if not has_num_rows:

        def without_num_rows(
            self: Any,
            kv_cache: torch.Tensor | None,
            swa_k_cache: torch.Tensor,
            swa_metadata: Any,
            attn_metadata: Any,
            swa_only: bool,
        ) -> Result:
            return _build_sparse_index_metadata(
                self, kv_cache, swa_k_cache, swa_metadata, attn_metadata, swa_only
            )

        return without_num_rows
    return _build_sparse_index_metadata


def _stock_on_an_empty_dict(name: str, *args: Any, **kwargs: Any) -> Result:
    """Verify mode's stock value: vLLM's method (kept as ``name``) on a copy of the
    SWA metadata whose dict is empty, so it builds."""
    original = _original[name]
    bound = inspect.signature(original).bind(*args, **kwargs)
    stock_metadata = copy.copy(bound.arguments["swa_metadata"])
    setattr(stock_metadata, _FIELD, {})
    bound.arguments["swa_metadata"] = stock_metadata
    result: Result = original(*bound.args, **bound.kwargs)
    return result


def stock_sparse_index(*args: Any, **kwargs: Any) -> Result:
    """Stock DeepSeek V4's sparse-index build, for verify mode."""
    return _stock_on_an_empty_dict(SPARSE_INDEX_NAME, *args, **kwargs)


def stock_sparse_index_v41(*args: Any, **kwargs: Any) -> Result:
    """Stock DeepSeek V4.1's sparse-index build, for verify mode."""
    return _stock_on_an_empty_dict(SPARSE_INDEX_V41_NAME, *args, **kwargs)


_V4_PARAMS = (
    ("self", REQUIRED),
    ("kv_cache", REQUIRED),
    ("swa_k_cache", REQUIRED),
    ("swa_metadata", REQUIRED),
    ("attn_metadata", REQUIRED),
    ("swa_only", REQUIRED),
)


def _find_sparse_index(
    module: ModuleType, name: str, key_of: Callable[..., str | None], num_rows: bool
) -> Target:
    cls = getattr(module, "DeepseekV4FlashInferMLAAttention", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.DeepseekV4FlashInferMLAAttention is absent")
    params = (*_V4_PARAMS, ("num_rows", None)) if num_rows else _V4_PARAMS
    method = expect_function(cls, "_build_sparse_index_metadata", params)
    if not callable(getattr(module, "build_flashinfer_mixed_sparse_indices", None)):
        raise SkipPatch(
            f"{module.__name__}.build_flashinfer_mixed_sparse_indices is absent"
        )
    # the method's source must still read and fill the dict the plugin binds
    code = method.__code__
    if _FIELD not in code.co_names:
        raise SkipPatch(
            f"{module.__name__}.DeepseekV4FlashInferMLAAttention."
            f"_build_sparse_index_metadata does not use {_FIELD} any more"
        )
    swa_module = sys.modules.get(_SWA_MODULE)
    if swa_module is None:
        raise SkipPatch(f"{module.__name__} is imported but {_SWA_MODULE} is not")
    expect_dataclass_fields(
        getattr(swa_module, "DeepseekSparseSWAMetadata", None), (_FIELD,)
    )
    _original[name] = method
    return Target(
        cls,
        "_build_sparse_index_metadata",
        method,
        _sparse_index_method(name, method, key_of, num_rows),
    )


def find_sparse_index(module: ModuleType) -> Target:
    """DeepSeek V4's sparse-index method, whose dict the stand-in binds to its
    metadata object."""
    return _find_sparse_index(module, SPARSE_INDEX_NAME, _v4_key, num_rows=True)


def find_sparse_index_v41(module: ModuleType) -> Target:
    """The same for DeepSeek V4.1's copy of the method (no ``num_rows``)."""
    return _find_sparse_index(module, SPARSE_INDEX_V41_NAME, _v41_key, num_rows=False)


def _c128_key(metadata: Any) -> Any:
    """One entry per layout; outside a scope none where a layout tensor is an
    inference tensor: vLLM's V1 draft loop adds 1 in place to
    ``seq_lens_cpu_upper_bound`` between builds, and a tensor made in the step has no
    version counter to show it. Inside a build's scope nothing writes it."""
    if stepcache.active_scope() is not None:
        return None
    lens, qsl = metadata.seq_lens_cpu_upper_bound, metadata.query_start_loc_cpu
    if (lens is not None and lens.is_inference()) or qsl.is_inference():
        return stepcache.BYPASS
    return None


@stepcache.step_cached(
    key=_c128_key,
    depends_on=("query_start_loc_cpu", "seq_lens_cpu_upper_bound"),
    name=C128_BOUNDARY_NAME,
)
def _cached_c128_boundary(metadata: Any) -> bool | None:
    result: bool | None = _original["c128_boundary"](metadata)
    return result


#: vLLM's ``_get_c128_boundary(metadata)``, once per layout
get_c128_boundary = _cached_c128_boundary


def stock_c128_boundary(metadata: Any) -> bool | None:
    """vLLM's ``_get_c128_boundary``, as kept when the patch applied (verify mode's
    stock value)."""
    result: bool | None = _original["c128_boundary"](metadata)
    return result


def find_c128_boundary(module: ModuleType) -> Target:
    """The DSv4 compressor module's ``_get_c128_boundary``, replaced by
    :func:`get_c128_boundary`."""
    original = expect_function(module, "_get_c128_boundary", (("metadata", REQUIRED),))
    _original["c128_boundary"] = original
    return Target(module, "_get_c128_boundary", original, get_c128_boundary)


def find_mixed_sparse_layer(module: ModuleType) -> Target:
    """DeepSeek V4.1's SM100 ``DeepseekV4FlashInferMLAAttention.forward_mqa``,
    wrapped to count the indexer runs and name the call for its compressed layer's
    one sparse-index build (:func:`_mixed_sparse_index`).

    A layer with an indexer ran it just before, in the same layer call
    (``_sparse_indexer_and_attn`` runs ``indexer_op`` before ``forward_mqa``; the
    short-context fill runs before both): a new run. Nothing assumes which index
    source a consumer reads or in which order the layers run; a pair serves only while
    no indexer-owning layer has run since. Builds made elsewhere (vLLM's specialized
    decode, whose own indexer path this count does not see) are vLLM's, uncached.
    """
    cls = getattr(module, "DeepseekV4FlashInferMLAAttention", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.DeepseekV4FlashInferMLAAttention is absent")
    params = (
        ("self", REQUIRED),
        ("q", REQUIRED),
        ("kv", REQUIRED),
        ("positions", REQUIRED),
        ("output", REQUIRED),
    )
    original = expect_function(cls, "forward_mqa", params)
    # the call chain the wrapper names: forward_mqa -> _forward -> the build (which
    # the sparse-index patch serves)
    forward = getattr(getattr(cls, "_forward", None), "__code__", None)
    if (
        "_forward" not in original.__code__.co_names
        or forward is None
        or "_build_sparse_index_metadata" not in forward.co_names
    ):
        raise SkipPatch(
            f"{module.__name__}.DeepseekV4FlashInferMLAAttention.forward_mqa no "
            "longer builds through _forward and _build_sparse_index_metadata"
        )
    runs = index_runs
    missing = object()

    def forward_mqa(
        self: Any,
        q: torch.Tensor,
        kv: torch.Tensor,
        positions: torch.Tensor,
        output: torch.Tensor,
    ) -> None:
        # an indexer-owning layer has just rewritten the buffer (a layer without the
        # attribute counts as one: never a stale hit)
        if getattr(self, "indexer", missing) is not None:
            runs.n += 1
        if getattr(self, "compress_ratio", 0) == 0:  # SWA-only: vLLM caches those
            original(self, q, kv, positions, output)
            return
        named = _mixed_call.set(self)
        try:
            original(self, q, kv, positions, output)
        finally:
            _mixed_call.reset(named)

    forward_mqa.__qualname__ = f"{cls.__name__}.forward_mqa"
    forward_mqa.__doc__ = original.__doc__
    forward_mqa.__wrapped__ = original  # type: ignore[attr-defined]
    return Target(cls, "forward_mqa", original, forward_mqa)
