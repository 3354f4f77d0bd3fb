# SPDX-License-Identifier: Apache-2.0
"""The host copies SGLang's FP4 KV cache reads again in every decode layer.

With an FP4 KV cache, FlashInfer's decode (``FlashInferAttnBackend.forward_decode``,
``layers/attention/flashinfer_backend.py``, read in SGLang 0.5.23) asks the pool for
an FP8 workspace in every layer: ``MHATokenToKVPool._prepare_dequant_decode_workspace``
(``mem_cache/memory_pool.py``) reads the batch's request rows and sequence lengths to
the host (``_to_cpu_int_list``: ``.cpu().tolist()``, a device-to-host sync for the
rows, which live on the GPU) before its loop over the requests. The rows and lengths
are the pass's own and no layer writes them: L layers pay L syncs where one is needed.

The plugin replaces ``_to_cpu_int_list`` (a static method, called only there) with a
cache that serves inside the forward pass's scope
(:mod:`~stepcache.integrations.sglang.scopes`): one host list per tensor of the pass,
bound to that tensor; anything else (a list, a call outside a pass) computes as SGLang
does. Its callers only iterate over the list. The per-layer dequantisation is each
layer's own and stays SGLang's.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

import stepcache

from ..patching import REQUIRED, SkipPatch, Target, expect_function

__all__ = ["HOST_ROWS_NAME", "MODULE", "find_host_rows", "host_rows"]

MODULE = "sglang.srt.mem_cache.memory_pool"
HOST_ROWS_NAME = "sglang.MHATokenToKVPool._to_cpu_int_list"
_ATTR = "_to_cpu_int_list"

#: SGLang's static method, kept by the patch that calls it
_original: dict[str, Any] = {}


def _in_pass(values: Any) -> Any:
    # A tensor of the pass, inside its scope (no write until the pass ends). Its id
    # tells the pass's tensors apart in the scope's one store: an entry without
    # dependencies serves only the object it was computed for (a weak reference), so a
    # later tensor given a dead one's id is a miss, never the dead one's rows.
    if isinstance(values, torch.Tensor) and stepcache.active_scope() is not None:
        return id(values)
    return stepcache.BYPASS


@stepcache.step_cached(key=_in_pass, name=HOST_ROWS_NAME)
def host_rows(values: Any) -> list[int]:
    """``values`` as a list of Python ints, read to the host once per pass."""
    rows: list[int] = _original[HOST_ROWS_NAME](values)
    return rows


def find_host_rows(module: ModuleType) -> Target:
    """The patch's ``find``: ``MHATokenToKVPool._to_cpu_int_list``, a static method
    of ``(values)``; installed as one."""
    cls = getattr(module, "MHATokenToKVPool", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.MHATokenToKVPool is absent")
    if not isinstance(vars(cls).get(_ATTR), staticmethod):
        raise SkipPatch(f"MHATokenToKVPool.{_ATTR} is absent or no static method")
    original = expect_function(cls, _ATTR, (("values", REQUIRED),))
    _original[HOST_ROWS_NAME] = original
    return Target(cls, _ATTR, original, host_rows, descriptor=staticmethod)
