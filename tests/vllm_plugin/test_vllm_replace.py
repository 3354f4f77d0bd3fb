# SPDX-License-Identifier: Apache-2.0
"""``CommonAttentionMetadata.replace()`` on vLLM 0.33: it is ``dataclasses.replace``,
so the new object gets the old one's private cache fields
(``_num_computed_tokens_cache``, ``_token_to_req_indices_cache``) with its new
layout.

The replace is the one of vLLM's Whisper block-pooling builder
(``vllm/model_executor/models/whisper_causal.py``: ``query_start_loc``,
``query_start_loc_cpu``, ``seq_lens``, ``seq_lens_cpu_upper_bound``,
``num_actual_tokens``, ``max_query_len``, ``max_seq_len`` and ``slot_mapping``, each
scaled by the block-pool size), run by vLLM's own builder class: the builder that
``create_whisper_attention_backend_with_block_pooling`` makes, over an underlying
backend whose builder returns the metadata it is given (the one stand-in here).

Stock vLLM gives the copy the original's computed-token counts (stale), and fails its
own assert on the request index (the carried rows are fewer than the copy's tokens).
The plugin must give the copy the values of its own layout, in every mode.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import stepcache
from benchmarks import vllm_builders as real_builders

pytestmark = pytest.mark.vllm

#: Whisper's block-pool size: every token and every sequence length times two
POOL = 2

#: the original: two requests of 3 and 1 new tokens after 5 and 2 computed tokens
QUERY_LENS, CONTEXT = [3, 1], [5, 2]
ORIGINAL = {"index": [0, 0, 0, 1], "computed": [5, 2]}
#: the same requests pooled: 6 and 2 new tokens after 10 and 4
POOLED_QUERY_LENS, POOLED_CONTEXT = [6, 2], [10, 4]
POOLED = {"index": [0, 0, 0, 0, 0, 0, 1, 1], "computed": [10, 4]}

#: (STEPCACHE_VLLM, stepcache's debug mode): production, and each debug mode
MODES = [("1", "off"), ("1", "checks"), ("1", "verify"), ("verify", "off")]
MODE_IDS = ["production", "debug-checks", "debug-verify", "plugin-verify"]
#: the two values vLLM keeps in a private field of the object
WHAT = ["index", "computed"]


# -- vLLM's Whisper builder, over a backend that hands back what it is given -----------
class _HandBack:
    """The underlying backend's builder: ``build`` returns the metadata it gets (what
    Whisper's ``build`` passes on to ``super().build``)."""

    def __init__(
        self, kv_cache_spec: Any, layer_names: Any, vllm_config: Any, device: Any
    ) -> None:
        self.vllm_config = vllm_config

    def build(
        self,
        common_prefix_len: int,
        common_attn_metadata: Any,
        fast_build: bool = False,
    ) -> Any:
        return common_attn_metadata


@functools.cache
def _whisper_backend() -> Any:
    from vllm.model_executor.models.whisper_causal import (
        create_whisper_attention_backend_with_block_pooling,
    )
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    class Underlying(CPUAttentionBackend):  # Whisper accepts the CPU backend's kind
        @staticmethod
        def get_builder_cls() -> type:
            return _HandBack

    return create_whisper_attention_backend_with_block_pooling(Underlying, POOL)


def whisper_builder() -> Any:
    """vLLM's ``WhisperCausalAttentionWithBlockPoolingBuilder`` (block-pool size
    :data:`POOL`, buffers for 8 requests and 32 tokens)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float32
    )
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=8, max_num_batched_tokens=32)
    )
    builder_cls = _whisper_backend().get_builder_cls()
    return builder_cls(spec, ["encoder.attn"], config, torch.device("cpu"))


def pooled_copy(cm: Any) -> Any:
    """The metadata Whisper's builder makes of ``cm`` with its ``cm.replace(...)``."""
    with torch.inference_mode():
        return whisper_builder().build(0, cm)


# -- the layouts and their values ------------------------------------------------------
def metadata(query_lens: list[int], context: list[int]) -> Any:
    """A real ``CommonAttentionMetadata`` made of inference tensors, as in a step."""
    return real_builders.common_metadata(real_builders.step_layout(query_lens, context))


def value(cm: Any, what: str) -> list[int]:
    """``what`` of ``cm``: its request index (into a buffer of its own) or its
    computed-token counts."""
    if what == "index":
        result = cm.token_to_req_indices(torch.zeros(32, dtype=torch.int32))
    else:
        result = cm.compute_num_computed_tokens()
    rows: list[int] = result.tolist()
    return rows


def values(cm: Any) -> dict[str, list[int]]:
    return {what: value(cm, what) for what in WHAT}


def layout_of(cm: Any) -> tuple[list[int], list[int], list[int], int]:
    return (
        cm.query_start_loc.tolist(),
        cm.query_start_loc_cpu.tolist(),
        cm.seq_lens.tolist(),
        cm.num_actual_tokens,
    )


@pytest.fixture
def fresh_pooled_values(stock: None, stock_kernel: None) -> dict[str, list[int]]:
    """Stock vLLM's values (the plugin off, vLLM's kernel in Triton's interpreter) for
    a new object of the pooled layout, whose fields were never filled."""
    fresh = metadata(POOLED_QUERY_LENS, POOLED_CONTEXT)
    assert layout_of(fresh) == layout_of(pooled_copy(metadata(QUERY_LENS, CONTEXT)))
    computed = values(fresh)
    assert computed == POOLED
    return computed


def test_stock_vllm_carries_the_computed_tokens_through_whispers_replace(
    fresh_pooled_values: dict[str, list[int]],
) -> None:
    """Documents stock vLLM 0.33 (the plugin off), not what the plugin should do.

    Computed on the original, then Whisper's ``replace``: the copy's computed-token
    counts are the original's, ``[5, 2]``, where a fresh object of its layout gives
    ``[10, 4]`` (stale, silently)."""
    cm = metadata(QUERY_LENS, CONTEXT)
    assert value(cm, "computed") == ORIGINAL["computed"] == [5, 2]
    pooled = pooled_copy(cm)
    assert value(pooled, "computed") == [5, 2]
    assert fresh_pooled_values["computed"] == [10, 4]


def test_stock_vllm_fails_its_own_assert_on_the_index_after_whispers_replace(
    fresh_pooled_values: dict[str, list[int]],
) -> None:
    """Documents stock vLLM 0.33 (the plugin off), not what the plugin should do.

    Computed on the original, then Whisper's ``replace``: the copy carries the
    original's 4 rows ``[0, 0, 0, 1]``, fewer than its 8 tokens, and the ``assert``
    of vLLM's ``token_to_req_indices`` on its cached rows fails (with Python's asserts
    off it would hand out those 4 rows, where a fresh object of the copy's layout
    gives ``[0, 0, 0, 0, 0, 0, 1, 1]``)."""
    cm = metadata(QUERY_LENS, CONTEXT)
    assert value(cm, "index") == ORIGINAL["index"] == [0, 0, 0, 1]
    pooled = pooled_copy(cm)
    with pytest.raises(AssertionError) as failed:
        pooled.token_to_req_indices(torch.zeros(32, dtype=torch.int32))
    # the assert on the carried rows, not the one on the buffer (32 rows, enough)
    assert "_token_to_req_indices_cache.shape[0] >= num_tokens" in str(
        failed.traceback[-1].statement
    )
    assert fresh_pooled_values["index"] == [0, 0, 0, 0, 0, 0, 1, 1]


def test_stock_vllm_computes_for_a_copy_made_before_the_original_computed(
    fresh_pooled_values: dict[str, list[int]],
) -> None:
    """Documents stock vLLM 0.33: the fields it carries are empty, so the copy
    computes its own values."""
    assert values(pooled_copy(metadata(QUERY_LENS, CONTEXT))) == fresh_pooled_values


@pytest.mark.parametrize("what", WHAT)
@pytest.mark.parametrize("scoped", [False, True], ids=["no-scope", "in-scope"])
@pytest.mark.parametrize(("mode", "debug"), MODES, ids=MODE_IDS)
def test_the_plugin_gives_whispers_copy_the_values_of_its_own_layout(
    fresh_pooled_values: dict[str, list[int]],
    register_plugin: Any,
    mode: str,
    debug: str,
    scoped: bool,
    what: str,
) -> None:
    """Computed on the original, then Whisper's ``replace``: the copy gets stock's
    value for a fresh object of its layout, and the original keeps its own; outside
    a scope and inside one build's scope."""
    register_plugin(mode)
    with stepcache.debug(debug), real_builders.maybe_scope(scoped):
        cm = metadata(QUERY_LENS, CONTEXT)
        assert value(cm, what) == ORIGINAL[what]
        pooled = pooled_copy(cm)
        assert value(pooled, what) == fresh_pooled_values[what]
        assert value(cm, what) == ORIGINAL[what]
