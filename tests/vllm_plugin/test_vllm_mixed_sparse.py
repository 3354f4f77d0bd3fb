# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4.1's SM100 mixed sparse indices with the plugin, on vLLM's real layer.

vLLM's ``DeepseekV4FlashInferMLAAttention.forward_mqa`` (V4.1, the SM100 FlashInfer
backend) runs for every layer of a small V4.1-shaped model on the CPU, as the SM120
test (test_vllm_topk.py) lays it out: a shared ``topk_indices_buffer``, two index
sources (layer 1, compressed, and layer 8, SWA-only), KV sources per compress ratio.
vLLM's own ``build_flashinfer_mixed_sparse_indices`` runs its real Triton kernel in
Triton's interpreter (conftest.py), behind a launch counter; FlashInfer's decode
kernel, CUDA-only, is a CPU stand-in that counts its launches and records the indices
it is handed. An indexer's run rewrites the buffer in place, unseen by torch's version
counter."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from v41_model import (
    COMPRESSED,
    DISTINCT,
    LAYERS,
    TOKENS,
    TOPK,
    Harness,
    Launches,
    calls_around_a_draft,
    calls_in_one_step,
    calls_with_caching_off,
    calls_with_kept_metadata,
    debug_report,
    flashmla_metadata,
    i32,
    index,
    kv_caches,
    new_layers,
    parity_counters,
    registered_with,
    same,
    stale_pair,
    swa_metadata,
)

import stepcache
from stepcache.integrations.vllm.dsv4 import MIXED_SPARSE_NAME, SPARSE_INDEX_V41_NAME

pytestmark = pytest.mark.vllm

SWA_ONLY_BUILDS = 1  # vLLM's own dict: one SWA-only build per step
WINDOW = 4


class FakeDecode:
    """FlashInfer's TRTLLM-gen sparse-MLA decode on the CPU: counts launches, records
    the indices and lengths, writes a number computed from them."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, **kw: Any) -> None:
        self.count += 1
        indices, lens, out = kw["sparse_indices"], kw["sparse_topk_lens"], kw["out"]
        self.seen.append((indices.clone(), lens.clone()))
        value = indices.float().sum(-1) + lens.float() * 3
        out.copy_(value.reshape(-1, 1, 1).expand(out.shape).to(out.dtype))


@dataclasses.dataclass
class Counts:
    builds: int = 0  # calls of vLLM's build function (the plugin's too)
    kernels: Launches | None = None
    decode: FakeDecode | None = None

    def reset(self) -> None:
        assert self.kernels is not None and self.decode is not None
        self.builds = self.kernels.count = self.decode.count = 0
        self.decode.seen.clear()

    def now(self) -> tuple[int, int, int]:
        assert self.kernels is not None and self.decode is not None
        return self.builds, self.kernels.count, self.decode.count


class Context:
    """What ``get_forward_context()`` hands the layer: the step's metadata by prefix."""

    attn_metadata: dict[str, Any] | None = None


@pytest.fixture
def counts(stock_kernel: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counts]:
    """The counters and the stand-ins, looked up by vLLM's module at call time."""
    from vllm.models.deepseek_v41.common.ops import cache_utils
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    found = Counts(
        kernels=Launches(cache_utils._build_flashinfer_mixed_sparse_indices_kernel),
        decode=FakeDecode(),
    )
    real = flashinfer_sparse.build_flashinfer_mixed_sparse_indices

    def build_flashinfer_mixed_sparse_indices(
        *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        found.builds += 1
        result: tuple[torch.Tensor, torch.Tensor] = real(*args, **kwargs)
        return result

    monkeypatch.setattr(
        cache_utils, "_build_flashinfer_mixed_sparse_indices_kernel", found.kernels
    )
    monkeypatch.setattr(
        flashinfer_sparse,
        "build_flashinfer_mixed_sparse_indices",
        build_flashinfer_mixed_sparse_indices,
    )
    monkeypatch.setattr(
        flashinfer_sparse,
        "flashinfer_trtllm_batch_decode_sparse_mla_dsv4",
        found.decode,
    )
    workspace = torch.zeros(16, dtype=torch.uint8)
    # 0.33 names it with a leading underscore
    for name in ("get_flashinfer_dsv4_workspace", "_get_flashinfer_dsv4_workspace"):
        if hasattr(flashinfer_sparse, name):
            monkeypatch.setattr(flashinfer_sparse, name, lambda device: workspace)
    monkeypatch.setattr(flashinfer_sparse, "get_forward_context", lambda: Context)
    yield found
    Context.attn_metadata = None


class Model:
    """The layers, the shared top-k buffer, and each KV source's compressed cache."""

    def __init__(self) -> None:
        from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

        self.buffer = torch.full((TOKENS, TOPK), -1, dtype=torch.int32)
        self.kv_caches = kv_caches()
        cls = flashinfer_sparse.DeepseekV4FlashInferMLAAttention
        self.layers = new_layers(cls, self.buffer)
        for layer in self.layers:
            layer.window_size = WINDOW
            source = layer.kv_source
            layer.compressed_cache_prefix = None if source is None else f"kv.{source}"
            if source is not None:
                layer._compressed_kv_cache = lambda s=source: self.kv_caches[s]

    def metadata(self, swa: Any) -> dict[str, Any]:
        """A step's metadata by prefix: one SWA metadata object for every layer (one
        SWA group), each KV source's own block table."""
        found: dict[str, Any] = {
            layer.swa_cache_layer.prefix: swa for layer in self.layers
        }
        for s in self.kv_caches:
            found[f"kv.{s}"] = flashmla_metadata(s)
        return found


@dataclasses.dataclass
class Step:
    swa: Any
    by_prefix: dict[str, Any]


def new_step(model: Model) -> Step:
    """A decode step (v41_model.swa_metadata), a window of three SWA indices."""
    swa = swa_metadata(
        decode_swa_indices=i32(
            [[t, t + 1, t + 2, -1] for t in range(TOKENS)]
        ).flatten(),
        decode_swa_lens=i32([3] * TOKENS),
        decode_swa_width=WINDOW,
        replay_start=i32([0, 0, 0]),
        max_decode_query_len=2,
    )
    return Step(swa, model.metadata(swa))


def run_step(
    model: Model,
    step: Step,
    seed: int,
    layers: range = range(LAYERS),
    indexers: bool = True,
) -> list[torch.Tensor]:
    """One decode step through ``layers`` as vLLM's forward runs them: an index
    source's indexer, then its ``forward_mqa``. Returns each layer's output."""
    Context.attn_metadata = step.by_prefix
    outputs = []
    for layer in (model.layers[i] for i in layers):
        if indexers and layer.indexer is not None:
            index(model.buffer, seed, layer.layer_id)
        out = torch.zeros((TOKENS, 2, 4), dtype=torch.bfloat16)
        q = torch.ones((TOKENS, 2, 4), dtype=torch.bfloat16)
        layer.forward_mqa(q, torch.empty(0), torch.arange(TOKENS), out)
        outputs.append(out)
    return outputs


@pytest.fixture
def h(counts: Counts) -> Harness:
    return Harness(Model, new_step, run_step, lambda: counts.builds, counts.reset)


# -- computations and launches per step, values -----------------------------------------
def test_stock_builds_in_every_compressed_layer(counts: Counts, stock: None) -> None:
    model = Model()
    run_step(model, new_step(model), 0)
    assert counts.now() == (COMPRESSED + SWA_ONLY_BUILDS,) * 2 + (LAYERS,)


def test_the_plugin_builds_each_distinct_pair_once_with_the_same_values(
    counts: Counts, h: Harness, register_plugin: Any
) -> None:
    assert counts.decode is not None
    model = Model()
    expected = h.steps(model, range(3))  # stock: the plugin is not registered yet
    stock_seen = list(counts.decode.seen)
    plugin = register_plugin()
    assert plugin.status()[MIXED_SPARSE_NAME] == "applied"
    counts.reset()
    stepcache.reset_stats()
    got, per_step = h.per_step(model, counts.now, range(3))
    # per step: 4 + 1 builds and kernel launches where stock has 12 + 1; the same 16
    # attention launches
    assert per_step == [(DISTINCT + SWA_ONLY_BUILDS,) * 2 + (LAYERS,)] * 3
    same(expected, got)
    same(stock_seen, counts.decode.seen)  # the very indices each layer attends with
    row = stepcache.stats()[MIXED_SPARSE_NAME]
    assert (row.misses, row.hits) == (3 * DISTINCT, 3 * (COMPRESSED - DISTINCT))
    assert SPARSE_INDEX_V41_NAME not in plugin.counters()  # nothing left uncached


def test_parity_mode_compares_every_build_with_stock(
    h: Harness, register_plugin: Any
) -> None:
    counters = parity_counters(h, register_plugin)
    assert counters[SPARSE_INDEX_V41_NAME] == {"verified": 2 * LAYERS}


def test_parity_mode_would_catch_a_stale_pair(h: Harness, register_plugin: Any) -> None:
    """An indexer run no patched layer announced makes a hit stale: parity mode says
    so, naming the sparse-index patch that served it."""
    stale = stale_pair(h, register_plugin)
    with pytest.raises(stepcache.StaleCacheError, match=SPARSE_INDEX_V41_NAME):
        stale()


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_modes_find_nothing(h: Harness, register_plugin: Any, mode: str) -> None:
    assert debug_report(h, register_plugin, mode) == []


def test_with_caching_off_every_layer_builds(h: Harness, register_plugin: Any) -> None:
    # the SWA-only pairs are a stepcache cache too
    assert calls_with_caching_off(h, register_plugin) == LAYERS


# -- invalidation: runs, not layer order; vLLM's clear() ---------------------------------
def test_each_index_source_run_invalidates_even_a_swa_only_one(
    h: Harness, register_plugin: Any
) -> None:
    """Layers 9-15 read source 8's indices (SWA-only: it builds no compressed pair),
    with the same KV sources and block tables as layers 1-7 for ratio 1: only the run
    tells them apart."""
    assert calls_in_one_step(h, register_plugin) == DISTINCT + SWA_ONLY_BUILDS


def test_the_same_metadata_in_the_next_run_rebuilds(
    h: Harness, register_plugin: Any
) -> None:
    """A metadata object kept across steps (no new object, no clear()): the sources'
    new runs, unseen by version counters, still rebuild."""
    # SWA-only: vLLM's dict
    assert calls_with_kept_metadata(h, register_plugin) == (
        3 * DISTINCT + SWA_ONLY_BUILDS
    )


def test_layers_in_another_order_get_their_own_runs_pairs(
    counts: Counts, register_plugin: Any
) -> None:
    """Consumers before their source in a step (an order vLLM does not use): what
    each reads is the buffer as the last indexer left it, in stock and here alike."""
    model = Model()
    order = [*range(9, LAYERS), *range(0, 9)]

    def run(step: Step) -> list[torch.Tensor]:
        model.buffer.fill_(-1)  # the same buffer before layer 9 in both runs
        return [out for i in order for out in run_step(model, step, 0, range(i, i + 1))]

    expected = run(new_step(model))
    register_plugin()
    same(expected, run(new_step(model)))


def test_a_draft_step_with_vllms_clear_rebuilds(
    h: Harness, register_plugin: Any
) -> None:
    """vLLM's draft step rewrites the SWA metadata in place (unseen here, through
    numpy), then calls ``flashinfer_sparse_index_cache.clear()``; no indexer runs."""
    # layers 9-15: two KV sources, and the SWA-only layer 12 (vLLM's dict); nothing
    # changed before their second run
    assert calls_around_a_draft(h, register_plugin) == (
        DISTINCT + SWA_ONLY_BUILDS,
        DISTINCT + SWA_ONLY_BUILDS + 2 + 1,
        DISTINCT + SWA_ONLY_BUILDS + 3,
    )


def test_builds_outside_a_patched_forward_are_vllms(
    counts: Counts, register_plugin: Any
) -> None:
    """vLLM's specialized decode calls the build itself, after an indexer path the
    run count does not see: uncached, as in vLLM."""
    model = Model()
    step = new_step(model)
    plugin = register_plugin()
    plugin.reset_counters()
    layer = model.layers[1]
    args = (
        model.kv_caches[1],
        layer.swa_cache_layer.kv_cache,
        step.swa,
        step.by_prefix["kv.1"],
        False,
    )
    first = layer._build_sparse_index_metadata(*args)
    second = layer._build_sparse_index_metadata(*args)
    assert counts.builds == 2 and first[2] is not second[2]
    same(first, second)
    assert plugin.counters()[SPARSE_INDEX_V41_NAME] == {"uncached": 2}


def test_off_by_default(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepcache.integrations import vllm as plugin_module

    model = Model()
    expected = run_step(model, new_step(model), 0)
    with registered_with(monkeypatch, None) as status:
        assert status[MIXED_SPARSE_NAME] == (
            f"skipped: off by default ({plugin_module.ADD_ENV}={MIXED_SPARSE_NAME} "
            "applies it)"
        )
        assert status[SPARSE_INDEX_V41_NAME] == "applied"
        counts.reset()
        same(expected, run_step(model, new_step(model), 0))
        assert counts.builds == COMPRESSED + SWA_ONLY_BUILDS
