# SPDX-License-Identifier: Apache-2.0
"""Micro-batches (dual-batch overlap) on vLLM 0.33 and 0.34: the metadata objects of one
step's ubatches, alive at once, share no value they should not.

vLLM #48659 is the shape of the bug looked for: a micro-batching cache whose key
lacked the micro-batch id, so micro-batch 1 got micro-batch 0's ``cu_seqlens``. V1's
``GPUModelRunner._build_attention_metadata`` splits each KV-cache group's
``CommonAttentionMetadata`` with ``split_attn_metadata`` (``vllm/v1/worker/
ubatch_utils.py``) and builds every slice inside the one scope the plugin opens
around that method; the slices here come from vLLM's own ``maybe_create_ubatch_slices``
and ``split_attn_metadata``, and each slice's request index and computed-token
counts are compared with stock vLLM's for that slice alone, in the order
slice 0, slice 1, slice 0. vLLM 0.34 has no V1 runner: its Model Runner V2 slices the
step's input batch with ``_slice_query_start_loc`` and ``_slice_seq_lens`` (into each
ubatch's own buffers), which the tests call there instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import stepcache
from benchmarks import vllm_builders as real_builders

pytestmark = pytest.mark.vllm

#: the two values vLLM keeps in a private field of the object
WHAT = ["index", "computed"]
#: (STEPCACHE_VLLM, stepcache's debug mode): production, and each debug mode
MODES = [("1", "off"), ("1", "checks"), ("1", "verify"), ("verify", "off")]
MODE_IDS = ["production", "debug-checks", "debug-verify", "plugin-verify"]


@dataclass(frozen=True)
class Step:
    """One step's requests, split into two ubatches at half its padded tokens."""

    query_lens: list[int]
    context: list[int]
    padded_tokens: int
    #: each slice's values, worked out by hand (the stock test checks them)
    expected: list[dict[str, list[int]]]


STEPS = {
    # 8 tokens padded to 10, split at 5: request 1 (5 tokens, from context 0) runs
    # 3 tokens in ubatch 0 and 2 in ubatch 1, which also holds the 2 padding rows
    "straddle": Step(
        query_lens=[2, 5, 1],
        context=[4, 0, 9],
        padded_tokens=10,
        expected=[
            {"index": [0, 0, 1, 1, 1], "computed": [4, 0]},
            {"index": [0, 0, 1, 0, 0], "computed": [3, 9]},
        ],
    ),
    # both ubatches have query_start_loc [0, 2, 4]: only seq_lens tells them apart
    "twins": Step(
        query_lens=[2, 2, 2, 2],
        context=[1, 2, 3, 4],
        padded_tokens=8,
        expected=[
            {"index": [0, 0, 1, 1], "computed": [1, 2]},
            {"index": [0, 0, 1, 1], "computed": [3, 4]},
        ],
    ),
}


def ubatches(step: Step) -> list[Any]:
    """The step's ``CommonAttentionMetadata`` (inference tensors, as a step makes
    them), split into its two ubatches by vLLM's own functions: V1's runner's
    ``split_attn_metadata`` (its padded slices: the last one runs to the padded token
    count) where the release has it, else Model Runner V2's (vLLM 0.34)."""
    from vllm.v1.worker import ubatch_utils

    layout = real_builders.step_layout(step.query_lens, step.context)
    layout["num_actual_tokens"] = step.padded_tokens
    cm = real_builders.common_metadata(layout)
    _, padded = ubatch_utils.maybe_create_ubatch_slices(
        True,
        np.array(step.query_lens, dtype=np.int32),
        step.padded_tokens,
        len(step.query_lens),
        2,
    )
    assert padded is not None and len(padded) == 2
    with torch.inference_mode():
        if hasattr(ubatch_utils, "split_attn_metadata"):
            return list(ubatch_utils.split_attn_metadata(padded, cm))
        return [_v2_slice(cm, s, len(step.query_lens)) for s in padded]


def _v2_slice(cm: Any, ubatch: Any, num_reqs: int) -> Any:
    """One ubatch's metadata as Model Runner V2 (vLLM 0.34) makes it: its request
    range clamped as ``create_ubatch_slices`` does, ``query_start_loc`` and
    ``seq_lens`` written by ``_slice_query_start_loc`` and ``_slice_seq_lens`` into
    buffers of the ubatch's own (``gpu/ubatch_utils.py``, ``_slice_input_batch``)."""
    from vllm.v1.worker.gpu import ubatch_utils as v2

    req_start = min(ubatch.request_slice.start, num_reqs - 1)
    req_stop = min(ubatch.request_slice.stop, num_reqs)
    tok_start, tok_stop = ubatch.token_slice.start, ubatch.token_slice.stop
    tokens = tok_stop - tok_start
    qsl = v2._slice_query_start_loc(
        cm.query_start_loc,
        torch.empty(req_stop - req_start + 1, dtype=torch.int32),
        req_start,
        req_stop,
        tok_start,
        tokens,
    )
    seq_lens = v2._slice_seq_lens(
        cm.seq_lens,
        torch.empty(req_stop - req_start, dtype=torch.int32),
        cm.query_start_loc,
        req_start,
        req_stop,
        tok_stop,
    )
    return cm.replace(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        seq_lens_cpu_upper_bound=seq_lens.clone(),
        is_prefilling=cm.is_prefilling[req_start:req_stop],
        num_reqs=req_stop - req_start,
        num_actual_tokens=tokens,
        max_query_len=int(qsl.diff().max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=cm.block_table_tensor[req_start:req_stop],
        slot_mapping=cm.slot_mapping[tok_start:tok_stop],
    )


def value(cm: Any, what: str, buffer: torch.Tensor) -> list[int]:
    """``what`` of ``cm``: its request index (into ``buffer``, as a builder passes its
    persistent one) or its computed-token counts."""
    result = (
        cm.token_to_req_indices(buffer)
        if what == "index"
        else cm.compute_num_computed_tokens()
    )
    rows: list[int] = result.tolist()
    return rows


def index_buffer() -> torch.Tensor:
    """A builder's persistent request-index buffer (made at its ``__init__``, outside
    the step's inference mode)."""
    return torch.full((16,), -1, dtype=torch.int32)


@pytest.fixture(params=list(STEPS))
def step(request: pytest.FixtureRequest) -> Step:
    return STEPS[request.param]


@pytest.fixture
def stock_values(
    stock: None, stock_kernel: None, step: Step
) -> list[dict[str, list[int]]]:
    """Stock vLLM's values (the plugin off, vLLM's kernel in Triton's interpreter) of
    each ubatch of ``step``, each computed on its own fresh slice."""
    return [
        {what: value(ubatches(step)[i], what, index_buffer()) for what in WHAT}
        for i in range(2)
    ]


def test_stock_vllm_gives_each_ubatch_the_values_worked_out_by_hand(
    step: Step, stock_values: list[dict[str, list[int]]]
) -> None:
    """Documents stock vLLM (the plugin off): the slices and their values."""
    slices = ubatches(step)
    assert [s.num_actual_tokens for s in slices] == [
        step.padded_tokens // 2,
        step.padded_tokens - step.padded_tokens // 2,
    ]
    assert stock_values == step.expected


def test_stock_vllm_interleaved_ubatches_with_a_buffer_each(
    step: Step, stock_values: list[dict[str, list[int]]]
) -> None:
    """Documents stock vLLM: each slice keeps its values in its own fields, and
    each ubatch's builder has its own buffer (V1 makes one builder per ubatch)."""
    slices = ubatches(step)
    buffers = [index_buffer(), index_buffer()]
    for i in (0, 1, 0):
        for what in WHAT:
            got = value(slices[i], what, buffers[i])
            assert got == stock_values[i][what], (i, what)


@pytest.mark.parametrize("shared", [False, True], ids=["own-buffer", "one-buffer"])
@pytest.mark.parametrize("scoped", [False, True], ids=["no-scope", "in-scope"])
@pytest.mark.parametrize(("mode", "debug"), MODES, ids=MODE_IDS)
def test_the_plugin_gives_each_ubatch_its_own_values(
    step: Step,
    stock_values: list[dict[str, list[int]]],
    register_plugin: Any,
    mode: str,
    debug: str,
    scoped: bool,
    shared: bool,
) -> None:
    """Both slices of one step alive at once, in one build's scope (as V1 builds
    them) or in none, called slice 0, slice 1, slice 0: each gets stock's values for
    itself alone. The index goes into a buffer per ubatch (V1's builder per ubatch),
    or into one buffer that both slices write (a builder shared by the ubatches)."""
    assert stock_values == step.expected
    register_plugin(mode)
    one = index_buffer()
    buffers = [one, one] if shared else [one, index_buffer()]
    with stepcache.debug(debug), real_builders.maybe_scope(scoped):
        slices = ubatches(step)
        for i in (0, 1, 0):
            for what in WHAT:
                got = value(slices[i], what, buffers[i])
                assert got == stock_values[i][what], (i, what)
