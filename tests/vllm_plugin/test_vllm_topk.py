# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4.1's decode global top-k with the plugin, on vLLM's real SM120 layer.

vLLM's ``DeepseekV4FlashInferSM120Attention._forward_sparse_impl`` runs for every
layer of a small V4.1-shaped model on the CPU: a shared ``topk_indices_buffer``,
two index sources (layer 1, compressed, and layer 8, SWA-only), four KV sources
(two per compress ratio). vLLM's own ``compute_global_topk_indices_and_lens`` runs
its real Triton kernel in Triton's interpreter (conftest.py), behind a launch
counter; FlashInfer's decode kernel, CUDA-only, is a CPU stand-in that counts its
launches and writes an output computed from the sparse indices it is handed. An
indexer's run is what the real one does to the buffer: a rewrite in place that
moves no torch version counter (here through a numpy view)."""

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
    called_outside_a_decode,
    calls_around_a_draft,
    calls_in_one_step,
    calls_with_caching_off,
    calls_with_kept_metadata,
    counted_global_topk,
    debug_report,
    flashmla_metadata,
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
from stepcache.integrations.vllm.global_topk import (
    BACKENDS,
    GLOBAL_TOPK_LAYER_NAME,
    GLOBAL_TOPK_NAME,
    Backend,
)

pytestmark = pytest.mark.vllm

NAMES = (GLOBAL_TOPK_LAYER_NAME, GLOBAL_TOPK_NAME)


class FakeDecode:
    """FlashInfer's sparse-MLA decode on the CPU: counts launches and writes, per
    token, a number computed from the indices and lengths it is handed."""

    def __init__(self) -> None:
        self.count = 0
        self.seen: list[tuple[Any, ...]] = []

    def __call__(self, **kw: Any) -> None:
        self.count += 1
        extra, lens = kw["extra_sparse_indices"], kw["extra_sparse_topk_lens"]
        out = kw["out"]
        value = kw["swa_topk_lens"].float() + kw["sparse_indices"].float().sum(-1)
        if extra is not None:
            value = value + extra.reshape(out.shape[0], -1).float().sum(-1) * 3 + lens
            self.seen.append((extra.clone(), lens.clone()))
        out.copy_(value.reshape(-1, 1, 1).expand(out.shape).to(out.dtype))


@dataclasses.dataclass
class Counts:
    computed: int = 0  # calls of vLLM's function that computed (the plugin's too)
    kernels: Launches | None = None
    decode: FakeDecode | None = None

    def reset(self) -> None:
        assert self.kernels is not None and self.decode is not None
        self.computed = self.kernels.count = self.decode.count = 0
        self.decode.seen.clear()


@pytest.fixture
def counts(stock_kernel: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Counts]:
    """The counters, put in place before the plugin registers (it keeps the function
    it finds: the counted one)."""
    from vllm.models.deepseek_v41.common.ops import cache_utils
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    found = Counts(
        kernels=Launches(cache_utils._compute_global_topk_indices_and_lens_kernel),
        decode=FakeDecode(),
    )
    monkeypatch.setattr(
        cache_utils, "_compute_global_topk_indices_and_lens_kernel", found.kernels
    )
    monkeypatch.setattr(
        flashinfer_sparse,
        "compute_global_topk_indices_and_lens",
        counted_global_topk(
            flashinfer_sparse.compute_global_topk_indices_and_lens, found
        ),
    )
    monkeypatch.setattr(
        flashinfer_sparse,
        "flashinfer_trtllm_batch_decode_sparse_mla_dsv4",
        found.decode,
    )
    yield found


# -- a small DeepSeek V4.1 (v41_model.py) of SM120 layers ---------------------------------
class Model:
    """The layers, the shared top-k buffer, and each KV source's cache and metadata."""

    def __init__(self) -> None:
        from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

        self.buffer = torch.full((TOKENS, TOPK), -1, dtype=torch.int32)
        workspace = torch.zeros(16, dtype=torch.uint8)
        cls = flashinfer_sparse.DeepseekV4FlashInferSM120Attention
        self.layers = new_layers(cls, self.buffer)
        for layer in self.layers:
            layer._get_workspace = lambda device, w=workspace: w
        self.kv_caches = kv_caches()

    def flashmla(self) -> dict[int, Any]:
        """Each KV source's metadata for a step: its own block table."""
        return {s: flashmla_metadata(s) for s in self.kv_caches}


@dataclasses.dataclass
class Step:
    """A step's metadata: the SWA metadata and each KV source's."""

    swa: Any
    flashmla: dict[int, Any]


def new_step(model: Model) -> Step:
    return Step(swa_metadata(), model.flashmla())


def run_step(
    model: Model,
    step: Step,
    seed: int,
    layers: range = range(LAYERS),
    indexers: bool = True,
) -> list[torch.Tensor]:
    """One decode step through ``layers``, as vLLM's forward runs them: an index
    source's indexer first, then its attention. Returns each layer's output."""
    outputs = []
    for layer in (model.layers[i] for i in layers):
        if indexers and layer.indexer is not None:
            index(model.buffer, seed, layer.layer_id)
        out = torch.zeros((TOKENS, 2, 4), dtype=torch.bfloat16)
        swa_only = layer.compress_ratio == 0
        layer._forward_sparse_impl(
            q=torch.ones((TOKENS, 2, 4), dtype=torch.bfloat16),
            output=out,
            flashmla_metadata=None if swa_only else step.flashmla[layer.kv_source],
            swa_metadata=step.swa,
            self_kv_cache=None if swa_only else model.kv_caches[layer.kv_source],
            swa_kv_cache=layer.swa_cache_layer.kv_cache,
            swa_only=swa_only,
        )
        outputs.append(out)
    return outputs


@pytest.fixture
def h(counts: Counts) -> Harness:
    return Harness(Model, new_step, run_step, lambda: counts.computed, counts.reset)


# -- (1)-(3): computations and launches per step, values ---------------------------------
def test_stock_maps_the_top_k_in_every_compressed_layer(
    counts: Counts, stock: None
) -> None:
    model = Model()
    run_step(model, new_step(model), 0)
    assert counts.computed == COMPRESSED == 12
    assert counts.kernels is not None and counts.kernels.count == COMPRESSED
    assert counts.decode is not None and counts.decode.count == LAYERS


def test_the_plugin_computes_each_distinct_result_once_with_the_same_values(
    counts: Counts, h: Harness, register_plugin: Any
) -> None:
    assert counts.kernels is not None and counts.decode is not None
    model = Model()
    expected = h.steps(model, range(3))  # stock: the plugin not registered yet
    stock_seen = list(counts.decode.seen)
    plugin = register_plugin()
    assert {plugin.status()[name] for name in NAMES} == {"applied"}
    counts.reset()
    stepcache.reset_stats()
    kernels, decode = counts.kernels, counts.decode
    got, per_step = h.per_step(
        model, lambda: (counts.computed, kernels.count, decode.count), range(3)
    )
    # per step: 4 computations and 4 top-k launches where stock has 12 and 12; the
    # attention launches are the same 16
    assert per_step == [(DISTINCT, DISTINCT, LAYERS)] * 3
    same(expected, got)
    same(stock_seen, counts.decode.seen)  # the very indices each layer attends with
    row = stepcache.stats()[GLOBAL_TOPK_NAME]
    assert (row.misses, row.hits) == (3 * DISTINCT, 3 * (COMPRESSED - DISTINCT))


def test_parity_mode_compares_every_call_with_stock(
    h: Harness, register_plugin: Any
) -> None:
    counters = parity_counters(h, register_plugin)
    assert counters[GLOBAL_TOPK_NAME] == {"verified": 2 * COMPRESSED}


def test_parity_mode_would_catch_a_stale_pair(h: Harness, register_plugin: Any) -> None:
    """Without the layer patch's run count (an indexer run it did not see), a hit is
    stale: parity mode says so, naming the patch."""
    stale = stale_pair(h, register_plugin)
    with pytest.raises(stepcache.StaleCacheError, match=GLOBAL_TOPK_NAME):
        stale()


# -- (4) debug modes -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_modes_find_nothing(h: Harness, register_plugin: Any, mode: str) -> None:
    assert debug_report(h, register_plugin, mode) == []


def test_with_caching_off_every_layer_computes(
    h: Harness, register_plugin: Any
) -> None:
    assert calls_with_caching_off(h, register_plugin) == COMPRESSED


# -- (5) invalidation --------------------------------------------------------------------
def test_each_index_source_run_invalidates_even_a_swa_only_one(
    h: Harness, register_plugin: Any
) -> None:
    """Layers 1-7 read source 1's indices, 9-15 source 8's (SWA-only, so it never
    computes a top-k itself): a hand cache cleared by the source's own top-k call
    would hand layers 9-15 source 1's pairs."""
    # two per source (its two KV sources), layer 1's compressed cache under both
    assert calls_in_one_step(h, register_plugin) == DISTINCT


def test_the_same_metadata_in_the_next_run_recomputes(
    h: Harness, register_plugin: Any
) -> None:
    """A metadata object kept across steps (no new object, no clear()): the sources'
    new runs, unseen by version counters, still recompute."""
    assert calls_with_kept_metadata(h, register_plugin) == 3 * DISTINCT


def test_a_draft_step_with_vllms_clear_recomputes(
    h: Harness, register_plugin: Any
) -> None:
    """vLLM's draft step rewrites ``token_to_req_indices`` and ``is_valid_token`` in
    place (unseen here, through numpy), then calls
    ``flashinfer_sparse_index_cache.clear()``; no indexer runs. The layers after the
    last source (MTP-like consumers) must read the new mapping."""
    # layers 9-15: two KV sources; nothing changed before their second run
    assert calls_around_a_draft(h, register_plugin) == (
        DISTINCT,
        DISTINCT + 2,
        DISTINCT + 2,
    )


def test_calls_outside_a_patched_decode_are_vllms(
    counts: Counts, register_plugin: Any
) -> None:
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    register_plugin()
    model = Model()
    step = new_step(model)
    first, second = called_outside_a_decode(flashinfer_sparse, model.buffer, step)
    assert counts.computed == 2 and first[0] is not second[0]
    same(first, second)


def test_the_cache_alone_serves_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only with the layer patch, which counts the runs, does the cache serve."""
    model = Model()
    expected = run_step(model, new_step(model), 0)
    with registered_with(monkeypatch, GLOBAL_TOPK_NAME) as status:
        assert status[GLOBAL_TOPK_NAME] == "applied"
        assert status[GLOBAL_TOPK_LAYER_NAME].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, new_step(model), 0))
        assert counts.computed == COMPRESSED


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.cls)
def test_off_by_default(
    backend: Backend, stock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backend's pair of patches (this SM120 one, FlashMLA's and Mega's of
    test_vllm_flashmla_topk.py) is off unless named."""
    from stepcache.integrations import vllm as plugin_module

    with registered_with(monkeypatch, None) as status:
        for name in (backend.name, backend.layer_name):
            assert status[name] == (
                f"skipped: off by default ({plugin_module.ADD_ENV}={name} applies it)"
            )
