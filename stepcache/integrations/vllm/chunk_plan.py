# SPDX-License-Identifier: Apache-2.0
"""``DeepseekSparseSWAMetadata.get_prefill_chunk_plan``, once per layer kind.

DeepSeek V4's and V4.1's prefill (``_forward_prefill`` of every attention layer:
``models/deepseek_v4{,1}/nvidia/flashmla.py``, ``flash_mla_mega_attn.py``, the AMD
backends) asks the step's sparse-SWA metadata for its prefill chunk plan: a host
loop with two ``.item()`` per prefill request and a few small torch ops. The plan
depends on the layer's ``(compress_ratio, prefill_chunk_size, has_compressed)`` and
on the step's host tensors, so 61 layers ask for about 3 distinct plans. The
replacement computes each plan once per metadata object. Its key holds the contents
of the two host tensors (``prefill_seq_lens_cpu``, ``prefill_query_lens_cpu``: a few
bytes per prefill request), so a write into them, through numpy or in place on an
inference tensor, is another key, never a stale plan. Its callers only iterate over
the plan; it is handed out as vLLM builds it, a list.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

import stepcache
from stepcache.kit import unrecorded

from ..patching import REQUIRED, Target, expect_dataclass_fields, expect_function

__all__ = [
    "PLAN_NAME",
    "find_prefill_chunk_plan",
    "get_prefill_chunk_plan",
    "stock_prefill_chunk_plan",
]

PLAN_NAME = "vllm.DeepseekSparseSWAMetadata.get_prefill_chunk_plan"

#: the scalars the plan reads besides its arguments and the two host tensors
_SCALARS = (
    "num_prefills",
    "prefill_window_size",
    "prefill_max_model_len",
    "prefill_max_num_batched_tokens",
)
_TENSORS = ("prefill_seq_lens_cpu", "prefill_query_lens_cpu")

#: vLLM's method, kept by the patch that calls it
_original: dict[str, Any] = {}


def _contents(t: object) -> object:
    """A host tensor's contents as a key part; ``None`` stays ``None``."""
    if isinstance(t, torch.Tensor):
        if t.device.type != "cpu":
            return stepcache.BYPASS
        return (t.dtype, tuple(t.shape), t.numpy().tobytes())
    return t


def _plan_key(
    self: Any,
    compress_ratio: int,
    prefill_chunk_size: int,
    has_compressed: bool | None = None,
) -> Any:
    if self.num_prefills == 0:  # vLLM returns [] at once: nothing to cache
        return stepcache.BYPASS
    # read unrecorded: the key holds their contents, so debug mode need not watch
    # them as dependencies
    parts = tuple(_contents(unrecorded(self, name)) for name in _TENSORS)
    if stepcache.BYPASS in parts:
        return stepcache.BYPASS
    if has_compressed is None:  # vLLM's default for V4.0's callers
        has_compressed = compress_ratio > 1
    return (compress_ratio, prefill_chunk_size, has_compressed, *parts)


def stock_prefill_chunk_plan(
    self: Any,
    compress_ratio: int,
    prefill_chunk_size: int,
    has_compressed: bool | None = None,
) -> list[tuple[int, int, int, int]]:
    """vLLM's method as the patch found it (verify mode's stock value)."""
    plan: list[tuple[int, int, int, int]] = _original[PLAN_NAME](
        self, compress_ratio, prefill_chunk_size, has_compressed
    )
    return plan


#: vLLM's method, once per layer kind and step layout
get_prefill_chunk_plan = stepcache.step_cached(
    key=_plan_key, depends_on=_SCALARS, name=PLAN_NAME
)(stock_prefill_chunk_plan)


def find_prefill_chunk_plan(module: ModuleType) -> Target:
    """``DeepseekSparseSWAMetadata.get_prefill_chunk_plan`` of the sparse-SWA
    module, replaced by :func:`get_prefill_chunk_plan`."""
    cls = getattr(module, "DeepseekSparseSWAMetadata", None)
    expect_dataclass_fields(cls, (*_SCALARS, *_TENSORS))
    assert isinstance(cls, type)
    params = (
        ("self", REQUIRED),
        ("compress_ratio", REQUIRED),
        ("prefill_chunk_size", REQUIRED),
        ("has_compressed", None),
    )
    original = expect_function(cls, "get_prefill_chunk_plan", params)
    _original[PLAN_NAME] = original
    return Target(cls, "get_prefill_chunk_plan", original, get_prefill_chunk_plan)
