# SPDX-License-Identifier: Apache-2.0
"""Keys for the caches that serve only inside a build's scope.

The layout caches of :mod:`~stepcache.integrations.vllm.gdn`,
:mod:`~stepcache.integrations.vllm.computed_tokens` and
:mod:`~stepcache.integrations.vllm.mamba` share a value between the metadata objects
of one build, where the plugin has opened a :func:`stepcache.scope` and vLLM writes
no layout tensor in place (:mod:`~stepcache.integrations.vllm.scopes`). Outside one
(a CUDA-graph capture, which writes ``seq_lens`` in place; a caller of vLLM's
functions in no build) they compute as stock vLLM does: nothing repeats there that a
cache would serve, and V1's persistent CPU buffers, written through numpy between
steps, move no version counter a cache could watch.

>>> import torch
>>> cpu_values(torch.tensor([0, 2, 5], dtype=torch.int32))
(torch.int32, (3,), (0, 2, 5))
>>> with stepcache.scope():
...     key_in_scope(4)
4
>>> key_in_scope(4) is stepcache.BYPASS
True
"""

from __future__ import annotations

from typing import Any

import torch

import stepcache

__all__ = ["cpu_values", "key_in_scope"]


def key_in_scope(key: Any) -> Any:
    """``key`` inside a scope; :data:`stepcache.BYPASS` (compute, cache nothing)
    outside one."""
    return stepcache.BYPASS if stepcache.active_scope() is None else key


def cpu_values(tensor: torch.Tensor) -> tuple[Any, ...] | None:
    """A CPU tensor's dtype, shape and values, as a key part; ``None`` for a tensor
    on a device (reading it would wait for the device)."""
    if tensor.device.type != "cpu":
        return None
    return tensor.dtype, tuple(tensor.shape), tuple(tensor.reshape(-1).tolist())
