# SPDX-License-Identifier: Apache-2.0
"""``CommonAttentionMetadata.compute_num_computed_tokens``, once per build.

vLLM 0.32 and 0.33 keep the value (``seq_lens - query_lens``, on the device) in a
field of the object, ``_num_computed_tokens_cache``, so one object computes it once.
But every KV-cache group gets an object of its own (V1 a ``copy()`` of the step's base
object, whose field is empty; V2 a new object per group), all made from the same
``query_start_loc`` and ``seq_lens``, and the GDN builder of each group asks its own:
Qwen3-Next computes it three times per prefill step. The replacement keeps the field
as vLLM does, where the plugin filled it for this object's ``query_start_loc`` and
``seq_lens``; an empty one is filled from a value shared, within one build's
:func:`stepcache.scope`, by every object with the same two tensors. A field the plugin
did not fill for these two tensors is computed again: ``replace()`` (a
``dataclasses.replace``) carries the original's field into a copy with other tensors,
where stock vLLM returns the original's stale value (Whisper's causal builder does
that: tests/vllm_plugin/test_vllm_replace.py). An in-place write to ``seq_lens`` on
the same object is not seen, as in stock vLLM (its step tensors are inference tensors,
with no version counter). Its callers read it (compare, index, copy it into their own
buffers); none writes it in place.
"""

from __future__ import annotations

import dataclasses
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
    "COMPUTED_NAME",
    "compute_num_computed_tokens",
    "computes",
    "find_num_computed_tokens",
    "stock_num_computed_tokens",
]

COMPUTED_NAME = "vllm.CommonAttentionMetadata.compute_num_computed_tokens"

_FIELD = "_num_computed_tokens_cache"

#: vLLM's method, kept by the patch that calls it
_original: dict[str, Any] = {}


@stepcache.step_cached(
    key=lambda self: key_in_scope(None),
    depends_on=("query_start_loc", "seq_lens"),
    name=COMPUTED_NAME,
)
def _shared(self: Any) -> torch.Tensor:
    # vLLM's method, on an object whose field is empty: it computes (and fills it)
    result: torch.Tensor = _original[COMPUTED_NAME](self)
    return result


#: where the plugin notes what it filled the field from: ``(query_start_loc,
#: seq_lens, value)``. Not a dataclass field, so ``replace()`` does not carry it.
_FILLED = "_stepcache_computed_from"


def _trusted(self: Any) -> torch.Tensor | None:
    """The field, if the plugin filled it for the object's two tensors."""
    result: torch.Tensor | None = getattr(self, _FIELD)
    # getattr, not vars(): vars() would make the object's inline attributes a dict,
    # which every later read of the step's metadata pays for
    filled = getattr(self, _FILLED, None)
    if (
        result is None
        or filled is None
        or filled[2] is not result
        or filled[0] is not self.query_start_loc
        or filled[1] is not self.seq_lens
    ):
        return None
    return result


def compute_num_computed_tokens(self: Any) -> torch.Tensor:
    """vLLM's method, its field filled from the build's shared value."""
    result = _trusted(self)
    if result is not None:  # vLLM's own cache, as vLLM reads it
        return result
    setattr(self, _FIELD, None)  # empty or carried from another layout
    result = _shared(self)
    setattr(self, _FIELD, result)
    setattr(self, _FILLED, (self.query_start_loc, self.seq_lens, result))
    return result


def computes(self: Any) -> bool:
    """Whether a call computes (its field is not one the plugin filled for these
    tensors): verify mode compares those; a filled field is vLLM's own cache, as vLLM
    reads it."""
    return _trusted(self) is None


def stock_num_computed_tokens(self: Any) -> torch.Tensor:
    """Verify mode's stock value: vLLM's method on a copy of the object with an empty
    field (so it computes)."""
    stock: torch.Tensor = _original[COMPUTED_NAME](
        dataclasses.replace(self, **{_FIELD: None})
    )
    return stock


def find_num_computed_tokens(module: ModuleType) -> Target:
    """``CommonAttentionMetadata.compute_num_computed_tokens`` (the class as the GDN
    builder's module binds it), replaced by :func:`compute_num_computed_tokens`."""
    cls = getattr(module, "CommonAttentionMetadata", None)
    expect_dataclass_fields(cls, ("query_start_loc", "seq_lens", _FIELD))
    assert isinstance(cls, type)
    original = expect_function(
        cls, "compute_num_computed_tokens", (("self", REQUIRED),)
    )
    # the method must still read and fill its field
    if _FIELD not in inspect.unwrap(original).__code__.co_names:
        raise SkipPatch(
            f"{cls.__qualname__}.compute_num_computed_tokens no longer uses {_FIELD}"
        )
    _original[COMPUTED_NAME] = original
    return Target(
        cls, "compute_num_computed_tokens", original, compute_num_computed_tokens
    )
