# SPDX-License-Identifier: Apache-2.0
"""vLLM's ``CommonAttentionMetadata`` caches, replaced by stepcache's.

vLLM 0.32 and 0.33 cache the request index in a field of ``CommonAttentionMetadata``,
``_token_to_req_indices_cache``. A field is carried by ``replace()`` and
``copy.copy``, and survives an in-place reassignment of ``query_start_loc`` (the V1
multi-token draft loop), so such an object returns the rows of the layout it had
before. The replacement declares what it is computed from, and recomputes when it
changes. (``_num_computed_tokens_cache`` is left to vLLM: in a real engine every
caller asks a fresh object once, so caching it never hit.)

How copies share the step's entries:

* ``copy.copy`` (the V1 model runner copies one base object per KV-cache group): the
  copy is attached to the original's store (:func:`stepcache.attach`), so entries whose
  dependencies are the same objects on both are computed once for all groups.
* ``replace()`` / ``dataclasses.replace`` (vLLM uses it to describe *another* batch,
  e.g. every query extended by N tokens): the copy starts with an empty store, and
  recomputes what it asks for, except the request index below.
* The request index: vLLM's V2 model runner passes one group's index to the next
  group's constructor (``_token_to_req_indices_cache=``), and ``replace()`` carries the
  field. The replacement keeps filling that field and remembers which layout each
  index it made was computed from; an index found in the field is reused (no
  computation, the same tensor, as in stock vLLM) only when it is one of ours and its
  layout is the object's current one. Anything else is recomputed.
"""

from __future__ import annotations

import contextlib
import sys
from types import ModuleType
from typing import Any, NamedTuple

import torch

import stepcache

from ..dsv4.request_index import (
    INDEX_DEPENDS_ON,
    INDEX_SPEC,
    check_index_buffer,
    request_index_array,
    total_tokens,
    write_request_index,
)
from ..patching import (
    REQUIRED,
    SkipPatch,
    Undo,
    counters,
    expect_dataclass_fields,
    expect_function,
    marked,
    replace_attribute,
    settings,
    verify_against_stock,
)

__all__ = [
    "COPY_NAME",
    "INDEX_NAME",
    "apply_copy",
    "apply_token_to_req_indices",
    "copy_sharing_store",
    "uses_kernel",
    "version_of",
]

INDEX_NAME = "vllm.CommonAttentionMetadata.token_to_req_indices"
COPY_NAME = "vllm.CommonAttentionMetadata.__copy__"

#: vLLM's methods, kept by the patches that call them
_original: dict[str, Any] = {}


def uses_kernel(device: torch.device) -> bool:
    """Whether the request index is computed by vLLM's own kernel for a buffer on
    ``device``: on every device but the CPU, where the numpy path runs instead."""
    return device.type != "cpu"


# -- which layout an index in the field was computed from ------------------------------
def version_of(tensor: torch.Tensor) -> int | None:
    """``tensor``'s version counter; ``None`` for an inference tensor (made under
    ``torch.inference_mode()``, as vLLM's steps run), which has none."""
    if tensor.is_inference():
        return None
    return tensor._version


class _Origin(NamedTuple):
    query_start_loc: torch.Tensor
    qsl_version: int | None
    query_start_loc_cpu: torch.Tensor
    qsl_cpu_version: int | None
    num_actual_tokens: int
    #: the index's own version: a later write into its buffer (another layout's rows)
    #: makes it another index
    index_version: int | None


#: The attribute on an index tensor the plugin made: the layout it was computed from.
#: It lives and dies with the tensor: no table, no lock, no weakref callback (a
#: callback that took a lock held while allocating could deadlock on a collection).
_ORIGIN = "_stepcache_origin"


def _remember(full: torch.Tensor, meta: Any) -> None:
    qsl, qsl_cpu = meta.query_start_loc, meta.query_start_loc_cpu
    setattr(
        full,
        _ORIGIN,
        _Origin(
            qsl,
            version_of(qsl),
            qsl_cpu,
            version_of(qsl_cpu),
            meta.num_actual_tokens,
            version_of(full),
        ),
    )


def _reusable_seed(meta: Any) -> torch.Tensor | None:
    """The index in ``meta``'s field if we computed it for ``meta``'s current layout
    (the same tensors, unchanged since, and its rows not written since; an inference
    tensor's changes cannot be seen, so an index computed from or into one is never
    reused)."""
    seed = getattr(meta, "_token_to_req_indices_cache", None)
    if not isinstance(seed, torch.Tensor):
        return None
    origin: _Origin | None = getattr(seed, _ORIGIN, None)
    if origin is None:
        return None  # not made by the plugin: its layout is unknown
    qsl, qsl_cpu = meta.query_start_loc, meta.query_start_loc_cpu
    if (
        origin.query_start_loc is qsl
        and origin.query_start_loc_cpu is qsl_cpu
        and origin.qsl_version is not None
        and origin.qsl_cpu_version is not None
        and origin.qsl_version == version_of(qsl)
        and origin.qsl_cpu_version == version_of(qsl_cpu)
        and origin.num_actual_tokens == meta.num_actual_tokens
        and origin.index_version is not None
        and origin.index_version == version_of(seed)
    ):
        return seed
    return None


# -- the replacements ------------------------------------------------------------------
@stepcache.step_cached(
    depends_on=INDEX_DEPENDS_ON,
    expect=INDEX_SPEC,
    ignore=("buffer",),  # each builder passes its own buffer; the rows are the same
    name=INDEX_NAME,
    # a later copy_ into the same buffer (another layout) invalidates the entry; a
    # Triton kernel's write does not move the version counter, so on a device this
    # guard sees only torch-level writes
    guard_result=True,
)
def token_to_req_indices(self: Any, buffer: torch.Tensor) -> torch.Tensor:
    """Build or reuse the per-token request index mapping (stepcache's cache).

    The same rows as vLLM's method, computed once per layout: by vLLM's own code (its
    CUDA-graph-safe Triton kernel) on a device, by numpy on the CPU.
    """
    num_tokens = self.num_actual_tokens
    # With caching off, or in verify mode (which recomputes to check a hit), the
    # index is computed afresh rather than taken from the field.
    fresh = stepcache.get_disabled() or stepcache.get_debug() == "verify"
    seed = None if fresh else _reusable_seed(self)
    if seed is not None:
        return seed[:num_tokens]
    num_mapped = total_tokens(self.query_start_loc_cpu)
    check_index_buffer(buffer, max(num_mapped, num_tokens), INDEX_NAME)
    if uses_kernel(buffer.device):
        # Only the caching changes: vLLM's method computes with its kernel from the
        # device query_start_loc (it fills its field, emptied first so it computes).
        self._token_to_req_indices_cache = None
        result: torch.Tensor = _original["token_to_req_indices"](self, buffer)
        full = self._token_to_req_indices_cache
    else:
        # Boundaries from the device query_start_loc (on the CPU, the same memory),
        # total from the host copy, as vLLM's kernel reads them.
        index = request_index_array(self.query_start_loc, num_mapped)
        full = write_request_index(index, buffer, num_tokens)
        self._token_to_req_indices_cache = full
        result = full[:num_tokens]
    if isinstance(full, torch.Tensor):
        _remember(full, self)
    return result


def token_to_req_indices_verified(self: Any, buffer: torch.Tensor) -> torch.Tensor:
    """:func:`token_to_req_indices`; with ``STEPCACHE_VLLM=verify``, also vLLM's
    method on a copy with an empty field and a buffer of its own, compared."""
    result = token_to_req_indices(self, buffer)
    if settings.verify:
        # copy.copy's default, not the patched __copy__: not one of vLLM's copies
        cls: Any = type(self)
        stock_meta = cls.__new__(cls)
        stock_meta.__dict__.update(vars(self), _token_to_req_indices_cache=None)
        stock = _original["token_to_req_indices"](stock_meta, buffer.clone())
        verify_against_stock(INDEX_NAME, result, stock)
    return result


def copy_sharing_store(self: Any) -> Any:
    """A shallow copy (as ``copy.copy`` makes one) that shares the original's step
    cache: entries whose dependencies are the same objects on both are reused."""
    counters.count(COPY_NAME, "copies")
    cls: Any = type(self)
    new = cls.__new__(cls)
    new.__dict__.update(self.__dict__)
    # A closed store (its step is over) is not shared: the copy gets a fresh one.
    with contextlib.suppress(stepcache.StepCacheError):
        stepcache.attach(new, stepcache.cache_of(self))
    if settings.verify:
        # copy.copy's default for this class: the original's attributes, shared
        verify_against_stock(COPY_NAME, _fields(new), _fields(self))
    return new


def _fields(meta: Any) -> dict[str, Any]:
    """What a copy carries, compared by identity (a shallow copy shares every
    value): the object's attributes but stepcache's own."""
    return {k: id(v) for k, v in vars(meta).items() if not k.startswith("_stepcache")}


# -- the patches -----------------------------------------------------------------------
_BACKEND = "vllm.v1.attention.backend"


def _metadata_class(module: ModuleType) -> type:
    # the patch waits for a DSv4 module; the class is in vLLM's attention backend
    backend = sys.modules.get(_BACKEND)
    cls = getattr(backend, "CommonAttentionMetadata", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{_BACKEND}.CommonAttentionMetadata is absent")
    return cls


def apply_token_to_req_indices(module: ModuleType) -> Undo:
    """Install :func:`token_to_req_indices` as ``CommonAttentionMetadata``'s method."""
    cls = _metadata_class(module)
    expect_dataclass_fields(cls, (*INDEX_DEPENDS_ON, "_token_to_req_indices_cache"))
    original = expect_function(
        cls, "token_to_req_indices", (("self", REQUIRED), ("buffer", REQUIRED))
    )
    _original["token_to_req_indices"] = original
    return replace_attribute(
        cls, "token_to_req_indices", marked(token_to_req_indices_verified, INDEX_NAME)
    )


def apply_copy(module: ModuleType) -> Undo:
    """Give ``CommonAttentionMetadata`` the ``__copy__`` of :func:`copy_sharing_store`,
    if ``copy.copy`` copies it the default way (its ``__dict__``)."""
    cls = _metadata_class(module)
    where = f"{_BACKEND}.CommonAttentionMetadata"
    if "__copy__" in vars(cls):
        raise SkipPatch(f"{where} defines __copy__ already")
    if "__slots__" in vars(cls):
        raise SkipPatch(f"{where} has __slots__; copy_sharing_store copies __dict__")
    for hook in ("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__"):
        if getattr(cls, hook, None) is not getattr(object, hook, None):
            raise SkipPatch(f"{where} customises {hook}")
    return replace_attribute(cls, "__copy__", marked(copy_sharing_store, COPY_NAME))
