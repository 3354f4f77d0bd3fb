# SPDX-License-Identifier: Apache-2.0
"""The two-batch-overlap split that SGLang computes three times per pass.

``TboForwardBatchPreparer.prepare`` (``batch_overlap/two_batch_overlap.py``, read in
SGLang 0.5.23) asks ``_compute_split_token_index(batch)`` three times of one parent
``ForwardBatch``: for the children's token counts, for their CPU counts, and in
``prepare_raw`` to cut the children. Each call sums the extend lengths up to the split
(``compute_split_token_index``). The plugin computes it once per parent batch,
depending on what the split reads: ``tbo_split_seq_index``, ``forward_mode``,
``extend_seq_lens_cpu`` (a list, compared by value) and ``spec_info`` (by identity).
The value is an ``int``: verify mode compares each call with stock's.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any

import stepcache

from ..patching import SkipPatch, Target

__all__ = ["MODULE", "SPLIT_TOKEN_NAME", "find_split_token_index", "split_token_index"]

MODULE = "sglang.srt.batch_overlap.two_batch_overlap"
SPLIT_TOKEN_NAME = "sglang.tbo.split_token_index"
_ATTR = "_compute_split_token_index"

#: SGLang's classmethod, bound to its class, kept by the patch that calls it
_original: dict[str, Any] = {}


@stepcache.step_cached(
    depends_on=(
        "tbo_split_seq_index",
        "forward_mode",
        "extend_seq_lens_cpu",
        "spec_info",
    ),
    name=SPLIT_TOKEN_NAME,
)
def split_token_index(batch: Any) -> int:
    """The first token of the second child batch."""
    index: int = _original[SPLIT_TOKEN_NAME](batch)
    return index


def _cached(cls: type, batch: Any) -> int:
    return split_token_index(batch)


def find_split_token_index(module: ModuleType) -> Target:
    """The patch's ``find``: ``TboForwardBatchPreparer._compute_split_token_index``,
    a classmethod of ``(cls, batch)``; installed as one."""
    cls = getattr(module, "TboForwardBatchPreparer", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.TboForwardBatchPreparer is absent")
    where = f"TboForwardBatchPreparer.{_ATTR}"
    raw = vars(cls).get(_ATTR)
    if not isinstance(raw, classmethod):
        raise SkipPatch(f"{where} is {'absent' if raw is None else 'no classmethod'}")
    if getattr(raw.__func__, "__stepcache_patch__", None) is not None:
        raise SkipPatch(f"{where} is patched already")
    params = list(inspect.signature(raw.__func__).parameters)
    if params != ["cls", "batch"]:
        raise SkipPatch(f"{where} has parameters {params}, expected ['cls', 'batch']")
    _original[SPLIT_TOKEN_NAME] = getattr(cls, _ATTR)
    return Target(cls, _ATTR, raw.__func__, _cached, descriptor=classmethod)
