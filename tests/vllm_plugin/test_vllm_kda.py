# SPDX-License-Identifier: Apache-2.0
"""Kimi's KDA builder (``KimiK3KDAMetadataBuilder``, a GDN builder's subclass) on
vLLM's real class: one builder per KDA group (vLLM PR #53301 counts 14 at TP8), each
asking its group's ``CommonAttentionMetadata`` for ``compute_num_computed_tokens`` in
a build with a prefill. Within one build's scope the plugin's computed-token cache
(applied once vLLM makes a GDN-family builder) computes it once for every group; the
rest of the KDA build is per group (its state indices) or the how-to's example
(``compute_causal_conv1d_metadata``)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

import stepcache
from benchmarks import vllm_builders as real_builders
from stepcache.integrations.vllm.computed_tokens import COMPUTED_NAME

pytestmark = pytest.mark.vllm

GROUPS = 3
#: two decodes, a new prefill, and a later chunk of a prefill with computed tokens
MIXED = ([1, 1, 5, 3], [4, 2, 0, 6])


@pytest.fixture
def counts(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, int]]:
    """vLLM's ``compute_num_computed_tokens`` and every ``.item()``, counted by
    wrappers installed before the plugin registers (it keeps the method it finds)."""
    real_builders.cpu_ready(monkeypatch)
    from vllm.v1.attention.backend import CommonAttentionMetadata

    yield real_builders.counted_calls(
        monkeypatch, CommonAttentionMetadata, "compute_num_computed_tokens", "computed"
    )


@pytest.fixture
def builders(monkeypatch: pytest.MonkeyPatch, counts: dict[str, int]) -> list[Any]:
    return [real_builders.kda_builder(monkeypatch) for _ in range(GROUPS)]


def build(builders: list[Any], runner: str) -> list[Any]:
    """One step with a prefill through Model Runner V2's ``build_attn_metadata`` or
    V1's copy per group (the plugin's scope opens around both)."""
    layout = real_builders.step_layout(*MIXED)
    if runner == "v2":
        return real_builders.v2_build(builders, layout)
    with stepcache.scope():  # V1's build method is the scope's patch, not called here
        return real_builders.v1_build(builders, layout)


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_stock_computes_the_counts_in_every_group(
    builders: list[Any], counts: dict[str, int], stock: None, runner: str
) -> None:
    built = build(builders, runner)
    assert counts["computed"] == GROUPS
    assert type(built[0]).__name__ == "KimiK3KDAMetadata"
    assert built[0].num_prefills == 2 and built[0].num_decodes == 2


@pytest.mark.parametrize("runner", ["v1", "v2"])
@pytest.mark.parametrize("mode", ["1", "verify"])
def test_the_plugin_computes_them_once_per_build_with_the_same_metadata(
    builders: list[Any],
    counts: dict[str, int],
    register_plugin: Any,
    mode: str,
    runner: str,
) -> None:
    from stepcache.integrations import vllm as plugin_module

    expected = build(builders, runner)  # stock: the plugin not registered
    stock_items = counts["items"]
    assert counts["computed"] == GROUPS
    register_plugin(mode)  # imports the patched modules: counted from here
    assert plugin_module.status()[COMPUTED_NAME] == "applied"
    counts.update(computed=0, items=0)
    stepcache.reset_stats()
    built = build(builders, runner)
    seen = dict(counts)  # before the comparison, which reads tensors too
    for ours, theirs in zip(built, expected, strict=True):
        assert stepcache.first_difference(theirs, ours) is None
    if mode == "1":
        assert seen["computed"] == 1
        # no fewer: the .item() calls are the split's and the conv1d metadata's, per group
        assert seen["items"] == stock_items
        row = stepcache.stats()[COMPUTED_NAME]
        assert (row.misses, row.hits) == (1, GROUPS - 1)
    else:  # verify mode runs stock's code on each call, to compare
        assert seen["computed"] >= GROUPS


@pytest.mark.parametrize("debug", ["checks", "verify"])
def test_debug_mode_finds_nothing(
    builders: list[Any], register_plugin: Any, debug: str
) -> None:
    register_plugin("1")
    expected = build(builders, "v2")
    with stepcache.debug(debug):
        built = build(builders, "v2")
    for ours, theirs in zip(built, expected, strict=True):
        assert stepcache.first_difference(theirs, ours) is None
