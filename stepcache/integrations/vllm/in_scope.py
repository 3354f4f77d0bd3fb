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

>>> with stepcache.scope():
...     key_in_scope(4)
4
>>> key_in_scope(4) is stepcache.BYPASS
True
"""

from __future__ import annotations

from typing import Any

import stepcache

__all__ = ["key_in_scope"]


def key_in_scope(key: Any) -> Any:
    """``key`` inside a scope; :data:`stepcache.BYPASS` (compute, cache nothing)
    outside one."""
    return stepcache.BYPASS if stepcache.active_scope() is None else key
