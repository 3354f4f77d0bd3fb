# SPDX-License-Identifier: Apache-2.0
"""vLLM's ``CommonAttentionMetadata`` request index, cached by stepcache.

vLLM 0.32 and 0.33 cache the request index in a field of ``CommonAttentionMetadata``,
``_token_to_req_indices_cache``, and thread it by hand from one KV-cache group's
metadata object to the next (Model Runner V2's ``build_attn_metadata``). A field is
carried by ``replace()`` and ``copy.copy``, and survives an in-place reassignment of
``query_start_loc`` (the V1 draft loop), so such an object returns the rows of the
layout it had before (docs/integrations.md: a stale index in V1's later draft steps).
The replacement declares what the index is computed from and recomputes when it
changes; the field is not read. The groups of one build share one computation
through the scope the plugin opens around each build
(:mod:`stepcache.integrations.vllm.scopes`): their objects are made from the same
layout tensors.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
import torch

import stepcache

from ..dsv4.request_index import (
    INDEX_SPEC,
    check_index_buffer,
    check_layout,
    request_index_array,
    write_request_index,
)
from ..patching import (
    REQUIRED,
    SkipPatch,
    Target,
    expect_dataclass_fields,
    expect_function,
)

__all__ = [
    "INDEX_NAME",
    "find_token_to_req_indices",
    "kernel_rows",
    "stock_token_to_req_indices",
    "token_to_req_indices",
    "uses_kernel",
]

INDEX_NAME = "vllm.CommonAttentionMetadata.token_to_req_indices"

#: What vLLM's method reads: the device boundaries (its kernel's input), the host
#: copy and the padded row count
INDEX_DEPENDS_ON = ("query_start_loc", "query_start_loc_cpu", "num_actual_tokens")

#: vLLM's methods, kept by the patches that call them
_original: dict[str, Any] = {}


def uses_kernel(device: torch.device) -> bool:
    """Whether the request index is computed by vLLM's own kernel for a buffer on
    ``device``: on every device but the CPU, where the numpy path runs instead."""
    return device.type != "cpu"


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
    if not isinstance(buffer, torch.Tensor):
        check_index_buffer(buffer, num_tokens, INDEX_NAME)  # its typed error
    if stepcache.get_debug() != "off":
        # the layout's values: debug mode's job. vLLM computes from the device
        # boundaries, which may differ from the host copy's (adaptive verification)
        check_layout(self, source="device")
    if uses_kernel(buffer.device):
        # Only the caching changes: vLLM's method computes with its kernel from the
        # device query_start_loc (it fills its field, emptied first so it computes).
        self._token_to_req_indices_cache = None
        result: torch.Tensor = _original["token_to_req_indices"](self, buffer)
        return result
    index = kernel_rows(self.query_start_loc, int(self.query_start_loc_cpu[-1]))
    return write_request_index(index, buffer, num_tokens)[:num_tokens]


def kernel_rows(query_start_loc: torch.Tensor, mapped: int) -> np.ndarray:
    """The rows vLLM's kernel (``compute_token_to_req_indices``) writes for the
    first ``mapped`` tokens (the host copy's total), in numpy: each token's request
    by the device boundaries (on the CPU, the same memory), a token past the
    device's last boundary the last request's. With adaptive verification the device
    boundaries differ from the host copy's (drafts trimmed on the device).

    >>> kernel_rows(torch.tensor([0, 2, 2, 5]), 5).tolist()
    [0, 0, 2, 2, 2]
    >>> kernel_rows(torch.tensor([0, 1, 3]), 5).tolist()  # trimmed on the device
    [0, 1, 1, 1, 1]
    >>> kernel_rows(torch.tensor([0, 2, 6]), 4).tolist()
    [0, 0, 1, 1]
    """
    index = request_index_array(query_start_loc)
    if index.shape[0] == mapped:  # the device and the host agree on the total
        return index
    if index.shape[0] > mapped:
        return index[:mapped]
    last = max(int(query_start_loc.shape[0]) - 2, 0)
    return np.concatenate(
        (index, np.full(mapped - index.shape[0], last, dtype=np.int32))
    )


def stock_token_to_req_indices(self: Any, buffer: torch.Tensor) -> torch.Tensor:
    """Verify mode's stock value: vLLM's method on a plain copy with an empty field
    and a buffer of its own (so it computes, and writes nothing of ours)."""
    cls: Any = type(self)
    stock_meta = cls.__new__(cls)
    stock_meta.__dict__.update(vars(self), _token_to_req_indices_cache=None)
    stock: torch.Tensor = _original["token_to_req_indices"](stock_meta, buffer.clone())
    return stock


# -- the patches -----------------------------------------------------------------------
_BACKEND = "vllm.v1.attention.backend"


def _metadata_class(module: ModuleType) -> type:
    # the patch waits for a DSv4 module; the class is in vLLM's attention backend
    backend = sys.modules.get(_BACKEND)
    cls = getattr(backend, "CommonAttentionMetadata", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{_BACKEND}.CommonAttentionMetadata is absent")
    return cls


def find_token_to_req_indices(module: ModuleType) -> Target:
    """``CommonAttentionMetadata.token_to_req_indices``, replaced by
    :func:`token_to_req_indices`."""
    cls = _metadata_class(module)
    expect_dataclass_fields(cls, (*INDEX_DEPENDS_ON, "_token_to_req_indices_cache"))
    original = expect_function(
        cls, "token_to_req_indices", (("self", REQUIRED), ("buffer", REQUIRED))
    )
    _original["token_to_req_indices"] = original
    return Target(cls, "token_to_req_indices", original, token_to_req_indices)
