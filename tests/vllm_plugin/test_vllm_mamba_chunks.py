# SPDX-License-Identifier: Apache-2.0
"""The Mamba builders' chunk layout on vLLM's real ``Mamba2AttentionMetadataBuilder``:
each KV-cache group's build reruns ``_compute_chunk_metadata`` (a host loop with
``.item()`` per prefill request) in stock vLLM; within one build's scope the plugin
computes it once (its cache is off by default: ``STEPCACHE_VLLM_ADD`` applies it)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import stepcache
from benchmarks import vllm_builders as real_builders
from stepcache.integrations.vllm.mamba import CHUNKS_NAME

pytestmark = pytest.mark.vllm

GROUPS = 3
#: a decode, a new prefill, and a later chunk of a prefill with computed tokens
MIXED = ([1, 5, 70], [10, 0, 64])
FIELDS = ("cu_chunk_seqlen_p", "seq_idx_p", "last_chunk_indices_p")


@pytest.fixture
def counts(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, int]]:
    """vLLM's ``_compute_chunk_metadata`` and every ``.item()``, counted by wrappers
    installed before the plugin registers (it keeps the method it finds)."""
    real_builders.cpu_ready(monkeypatch)
    from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder

    yield real_builders.counted_calls(
        monkeypatch,
        BaseMambaAttentionMetadataBuilder,
        "_compute_chunk_metadata",
        "chunks",
        staticmethod,
    )


def build() -> list[Any]:
    """One prefill step through Model Runner V2's ``build_attn_metadata``, one
    Mamba2 group per builder (each builds its own metadata, as V2 does with
    speculative decoding on)."""
    builders = [real_builders.mamba2_builder() for _ in range(GROUPS)]
    return real_builders.v2_build(builders, real_builders.step_layout(*MIXED))


def fields(md: Any) -> list[list[int]]:
    return [getattr(md, name).tolist() for name in FIELDS]


def test_stock_computes_the_chunks_in_every_group(
    counts: dict[str, int], stock: None
) -> None:
    built = build()
    assert counts["chunks"] == GROUPS
    assert all(fields(md) == fields(built[0]) for md in built)
    assert built[0].num_prefills == 2


@pytest.mark.parametrize("mode", ["1", "verify"])
def test_the_plugin_computes_them_once_per_build(
    counts: dict[str, int], register_plugin: Any, mode: str
) -> None:
    from stepcache.integrations import vllm as plugin_module

    expected = [fields(md) for md in build()]  # stock: the plugin not registered
    stock_items = counts["items"]
    counts.update(chunks=0, items=0)
    register_plugin(mode)  # every patch off by default added
    assert plugin_module.status()[CHUNKS_NAME] == "applied"
    stepcache.reset_stats()
    built = build()
    assert [fields(md) for md in built] == expected
    if mode == "1":
        assert counts["chunks"] == 1
        assert counts["items"] < stock_items
        row = stepcache.stats()[CHUNKS_NAME]
        assert (row.misses, row.hits) == (1, GROUPS - 1)
    else:  # verify mode runs stock's code on each call, to compare
        assert counts["chunks"] >= GROUPS


def test_debug_checks_find_nothing(
    counts: dict[str, int], register_plugin: Any
) -> None:
    register_plugin("1")
    with stepcache.debug("checks"):
        built = build()
    assert all(fields(md) == fields(built[0]) for md in built)
    with stepcache.debug("verify"):
        build()
