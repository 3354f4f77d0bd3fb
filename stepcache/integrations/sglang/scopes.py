# SPDX-License-Identifier: Apache-2.0
"""SGLang's forward pass, opened as a :func:`stepcache.scope`.

``ModelRunner.forward`` (``model_executor/model_runner.py``, read in SGLang 0.5.23)
runs one forward pass: it prepares the pass's ``ForwardBatch`` and runs every layer
(two-batch overlap's children inside it). Nothing writes the batch's tensors in place
while its layers run, so inside the pass a cached value may be matched to them by
identity: the promise a scope makes. The plugin's caches on the ``ForwardBatch`` need
no scope (the batch is made anew each pass); the ones on a tensor of the pass
(:mod:`~stepcache.integrations.sglang.fp4`) serve only inside it.
"""

from __future__ import annotations

from types import ModuleType

from ..patching import SkipPatch, Target, expect_parameters

__all__ = ["FORWARD_NAME", "MODULE", "find_forward"]

MODULE = "sglang.srt.model_executor.model_runner"
FORWARD_NAME = "sglang.ModelRunner.forward"


def find_forward(module: ModuleType) -> Target:
    """The patch's ``find``: ``ModelRunner.forward``, taking ``forward_batch``."""
    cls = getattr(module, "ModelRunner", None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.ModelRunner is absent")
    original = expect_parameters(cls, "forward", ("self", "forward_batch"))
    return Target(cls, "forward", original)
