# SPDX-License-Identifier: Apache-2.0
"""The profiler on real vLLM modules (CPU paths): wrapping the whole of
``vllm.v1.attention.backends.utils`` while four metadata builders each split the step's
batch, it finds ``split_decodes_and_prefills`` and suggests its cache.

The builders stand in for vLLM's (DSv4's sparse-SWA, indexer and sparse-MLA builders,
and a speculative-decoding one with a larger threshold); they call the real function
through the names the real builder modules bound with ``from ... import``, as vLLM's
own builders do, so the profiler has to wrap those aliases too.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from require_vllm import vllm_or_skip

import stepcache

pytestmark = [
    pytest.mark.vllm,
    # vLLM's modules use torch.jit.script_method, deprecated by torch, at import
    pytest.mark.filterwarnings("ignore::DeprecationWarning:torch.jit._script"),
]

SPLIT = "vllm.v1.attention.backends.utils:split_decodes_and_prefills"
BATCHES = ((1, 1, 3, 7), (1, 1, 1, 1), (2, 9), (1, 4, 4, 12, 1))


@pytest.fixture(scope="module")
def vllm_modules() -> dict[str, ModuleType]:
    vllm_or_skip()  # a namespace package named vllm skips too
    from vllm.v1.attention import backend
    from vllm.v1.attention.backends import utils
    from vllm.v1.attention.backends.mla import indexer, sparse_swa

    if utils.split_decodes_and_prefills.__module__ != utils.__name__:
        pytest.fail(
            "vllm's split_decodes_and_prefills is replaced (the stepcache vLLM plugin "
            "is registered): unregister it before profiling stock vLLM"
        )
    return {
        "backend": backend,
        "utils": utils,
        "indexer": indexer,
        "sparse_swa": sparse_swa,
    }


def _metadata(backend: ModuleType, query_lens: tuple[int, ...]) -> Any:
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.tensor(np.cumsum(query_lens), dtype=torch.int32)
    seq_lens = torch.tensor([q + 16 for q in query_lens], dtype=torch.int32)
    tokens = int(qsl[-1])
    return backend.CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.clone(),
        seq_lens=seq_lens,
        num_reqs=len(query_lens),
        num_actual_tokens=tokens,
        max_query_len=max(query_lens),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=torch.zeros((len(query_lens), 4), dtype=torch.int32),
        slot_mapping=torch.arange(tokens, dtype=torch.int64),
    )


def _serve(m: dict[str, ModuleType]) -> list[tuple[int, ...]]:
    """Steps of four builders, each splitting the step's batch as vLLM's do."""
    out = []
    for lens in BATCHES * 2:
        cm = _metadata(m["backend"], lens)
        out.append(m["sparse_swa"].split_decodes_and_prefills(cm, decode_threshold=1))
        out.append(m["indexer"].split_decodes_and_prefills(cm))
        out.append(m["utils"].split_decodes_and_prefills(cm, decode_threshold=1))
        out.append(m["indexer"].split_decodes_and_prefills(cm, decode_threshold=4))
    return out


def test_finds_split_decodes_and_prefills(vllm_modules: dict[str, ModuleType]) -> None:
    m = vllm_modules
    original = m["utils"].split_decodes_and_prefills
    expected = _serve(m)
    with stepcache.profile(
        "vllm.v1.attention.backends.utils", step_by="common_attn_metadata"
    ) as report:
        assert m["indexer"].split_decodes_and_prefills is not original  # alias wrapped
        got = _serve(m)
    assert got == expected
    for name in ("utils", "indexer", "sparse_swa"):
        assert m[name].split_decodes_and_prefills is original
    top = report.redundant[0]
    assert top.name == SPLIT
    assert report.steps == 2 * len(BATCHES)
    assert top.calls_per_step == 4.0
    # Threshold 1 three times (by keyword, by default, by keyword): two repeats a step.
    assert top.identical == top.redundant == 2 * report.steps
    s = top.suggestion
    assert s is not None
    assert (s.owner, s.key, s.bypass) == (
        "common_attn_metadata",
        ("decode_threshold",),
        None,
    )
    assert {
        "query_start_loc_cpu",
        "num_reqs",
        "num_actual_tokens",
        "max_query_len",
    } <= set(s.depends_on)
    assert s.decorator is not None
    assert s.decorator.startswith('@stepcache.step_cached(key="decode_threshold", ')
    assert "owner=" not in s.decorator  # the owner is the first parameter
