# SPDX-License-Identifier: Apache-2.0
"""DeepSeek V4.1's decode global top-k with the plugin, on vLLM's FlashMLA layers.

The model of test_vllm_topk.py (a shared ``topk_indices_buffer``, index sources 1
and 8, four KV sources), built of vLLM's real ``DeepseekV4FlashMLAAttention``, whose
``_forward_decode`` runs for every layer, or of its Mega-attention subclass, whose
``_decode_compressed_kv_and_topk`` (the method that makes the call, once per layer
decode) runs for every layer. vLLM's ``compute_global_topk_indices_and_lens`` runs
its real Triton kernel in Triton's interpreter, behind a launch counter; FlashMLA's
decode kernel, CUDA-only, is a CPU stand-in that counts its launches and writes an
output computed from the indices it is handed (the Mega kernel is not reached: the
method's triple is the output)."""

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
    Harness,
    Launches,
    called_outside_a_decode,
    calls_around_a_draft,
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
    FLASHMLA,
    MEGA,
    Backend,
)

pytestmark = pytest.mark.vllm

_MODULES = {
    FLASHMLA.name: "vllm.models.deepseek_v41.nvidia.flashmla",
    MEGA.name: "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn",
}


class FakeFlashMLA:
    """``flash_mla_with_kvcache`` on the CPU: counts launches and writes, per token,
    a number computed from the indices and lengths it is handed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, **kw: Any) -> tuple[torch.Tensor, None]:
        self.count += 1
        out = kw["out"]
        value = kw["topk_length"].float() + kw["indices"].float().sum(-1)
        extra, lens = kw["extra_indices_in_kvcache"], kw["extra_topk_length"]
        if extra is not None:
            value = value + extra.reshape(out.shape[0], -1).float().sum(-1) * 3 + lens
        out.copy_(value.reshape(-1, 1, 1, 1).expand(out.shape).to(out.dtype))
        return out, None


@dataclasses.dataclass
class Counts:
    backend: Backend
    kernels: Launches
    decode: FakeFlashMLA
    computed: int = 0  # calls of vLLM's function that computed (the plugin's too)
    layers: int = 0  # layer decodes (FlashMLA: its kernel's launches)

    def reset(self) -> None:
        self.computed = self.kernels.count = self.decode.count = self.layers = 0

    def now(self) -> tuple[int, int, int]:
        return self.computed, self.kernels.count, self.layers


@pytest.fixture(params=[FLASHMLA, MEGA], ids=["flashmla", "mega"])
def counts(
    request: pytest.FixtureRequest,
    stock_kernel: None,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Counts]:
    """The counters of one backend, put in place before the plugin registers (it
    keeps the function it finds: the counted one)."""
    import importlib

    from vllm.models.deepseek_v41.common.ops import cache_utils
    from vllm.models.deepseek_v41.nvidia import flashmla

    from stepcache.integrations import vllm as plugin_module

    plugin_module.unregister()
    backend: Backend = request.param
    module = importlib.import_module(_MODULES[backend.name])
    found = Counts(
        backend,
        Launches(cache_utils._compute_global_topk_indices_and_lens_kernel),
        FakeFlashMLA(),
    )
    monkeypatch.setattr(
        cache_utils, "_compute_global_topk_indices_and_lens_kernel", found.kernels
    )
    monkeypatch.setattr(
        module,
        "compute_global_topk_indices_and_lens",
        counted_global_topk(module.compute_global_topk_indices_and_lens, found),
    )
    monkeypatch.setattr(flashmla, "flash_mla_with_kvcache", found.decode)
    yield found


class FlashMLAModel:
    """test_vllm_topk's model (v41_model.py), of the backend's real layer class,
    whose layer decodes ``counts`` counts."""

    def __init__(self, counts: Counts) -> None:
        import importlib

        backend = counts.backend
        cls = getattr(importlib.import_module(_MODULES[backend.name]), backend.cls)
        self.backend = backend
        self.counts = counts
        self.buffer = torch.full((TOKENS, 8), -1, dtype=torch.int32)
        self.kv_caches = kv_caches()
        self.layers = new_layers(cls, self.buffer)
        for layer in self.layers:
            if layer.kv_source is not None:
                cache = self.kv_caches[layer.kv_source]
                layer._compressed_kv_cache = lambda c=cache: c

    def flashmla(self) -> dict[int, Any]:
        return {s: flashmla_metadata(s) for s in self.kv_caches}


@dataclasses.dataclass
class Step:
    swa: Any
    flashmla: dict[int, Any]


def new_step(model: FlashMLAModel) -> Step:
    swa = swa_metadata()
    # FlashMLA's planner state, one per layer type (the fake kernel ignores it)
    swa.tile_sched_swaonly = swa.tile_sched_c1a = swa.tile_sched_c2a = object()
    return Step(swa, model.flashmla())


def run_step(
    model: FlashMLAModel,
    step: Step,
    seed: int,
    layers: range = range(LAYERS),
    indexers: bool = True,
) -> list[Any]:
    """One decode step through ``layers``: an index source's indexer first, then its
    attention's decode. Returns each layer's output."""
    outputs: list[Any] = []
    for layer in (model.layers[i] for i in layers):
        if indexers and layer.indexer is not None:
            index(model.buffer, seed, layer.layer_id)
        swa_only = layer.compress_ratio == 0
        metadata = None if swa_only else step.flashmla[layer.kv_source]
        model.counts.layers += 1
        if model.backend is MEGA:
            _, indices, lens = layer._decode_compressed_kv_and_topk(metadata, step.swa)
            outputs.append(None if indices is None else (indices.clone(), lens.clone()))
            continue
        out = torch.zeros((TOKENS, 2, 4), dtype=torch.bfloat16)
        layer._forward_decode(
            q=torch.ones((TOKENS, 2, 4), dtype=torch.bfloat16),
            kv_cache=None if swa_only else model.kv_caches[layer.kv_source],
            swa_metadata=step.swa,
            attn_metadata=metadata,
            swa_only=swa_only,
            output=out,
        )
        outputs.append(out)
    return outputs


@pytest.fixture
def h(counts: Counts) -> Harness:
    return Harness(
        lambda: FlashMLAModel(counts),
        new_step,
        run_step,
        lambda: counts.computed,
        counts.reset,
    )


# -- computations and launches per step, values ------------------------------------------
def test_stock_maps_the_top_k_in_every_compressed_layer(
    counts: Counts, stock: None
) -> None:
    model = FlashMLAModel(counts)
    run_step(model, new_step(model), 0)
    assert counts.now() == (COMPRESSED, COMPRESSED, LAYERS)
    assert counts.decode.count == (LAYERS if counts.backend is FLASHMLA else 0)


def test_the_plugin_computes_each_distinct_result_once_with_the_same_values(
    counts: Counts, h: Harness, register_plugin: Any
) -> None:
    model = FlashMLAModel(counts)
    expected = h.steps(model, range(3))  # stock: not registered yet
    plugin = register_plugin()
    backend = counts.backend
    assert {plugin.status()[n] for n in (backend.name, backend.layer_name)} == {
        "applied"
    }
    counts.reset()
    stepcache.reset_stats()
    got, per_step = h.per_step(model, counts.now, range(3))
    # per step: 4 computations and 4 top-k launches where stock has 12 and 12; every
    # layer still decodes
    assert per_step == [(DISTINCT, DISTINCT, LAYERS)] * 3
    assert counts.decode.count == (3 * LAYERS if backend is FLASHMLA else 0)
    same(expected, got)
    row = stepcache.stats()[backend.name]
    assert (row.misses, row.hits) == (3 * DISTINCT, 3 * (COMPRESSED - DISTINCT))


def test_parity_mode_compares_every_call_with_stock(
    counts: Counts, h: Harness, register_plugin: Any
) -> None:
    counters = parity_counters(h, register_plugin)
    assert counters[counts.backend.name] == {"verified": 2 * COMPRESSED}


def test_parity_mode_would_catch_a_stale_pair(
    counts: Counts, h: Harness, register_plugin: Any
) -> None:
    """An indexer run no patched layer announced makes a hit stale: parity mode says
    so, naming the patch (the run count is what keeps it fresh)."""
    stale = stale_pair(h, register_plugin)
    with pytest.raises(stepcache.StaleCacheError, match=counts.backend.name):
        stale()


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_modes_find_nothing(h: Harness, register_plugin: Any, mode: str) -> None:
    assert debug_report(h, register_plugin, mode) == []


# -- invalidation ------------------------------------------------------------------------
def test_the_same_metadata_in_the_next_run_recomputes(
    h: Harness, register_plugin: Any
) -> None:
    """One metadata object across runs (no new object, no clear()): each source's new
    run, unseen by version counters, recomputes; layer 8 is SWA-only and yet counts."""
    assert calls_with_kept_metadata(h, register_plugin) == 3 * DISTINCT


def test_a_draft_step_with_vllms_clear_recomputes(
    h: Harness, register_plugin: Any
) -> None:
    """vLLM's draft step rewrites ``token_to_req_indices`` and ``is_valid_token`` in
    place, then clears ``flashinfer_sparse_index_cache`` (the SWA builder's, for
    every backend); no indexer runs."""
    # layers 9-15: two KV sources; nothing changed before their second run
    assert calls_around_a_draft(h, register_plugin) == (
        DISTINCT,
        DISTINCT + 2,
        DISTINCT + 2,
    )


def test_calls_outside_a_patched_decode_are_vllms(
    counts: Counts, register_plugin: Any
) -> None:
    import importlib

    register_plugin()
    module = importlib.import_module(_MODULES[counts.backend.name])
    model = FlashMLAModel(counts)
    step = new_step(model)
    first, second = called_outside_a_decode(module, model.buffer, step)
    assert counts.computed == 2 and first[0] is not second[0]
    same(first, second)


def test_another_backends_patches_serve_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backend's pair of patches but this one's: its layers compute as stock's
    (a call named for one module's function is not another's)."""
    from stepcache.integrations.vllm.global_topk import BACKENDS

    model = FlashMLAModel(counts)
    expected = run_step(model, new_step(model), 0)
    others = [b for b in BACKENDS if b is not counts.backend]
    names = [n for b in others for n in (b.name, b.layer_name)]
    with registered_with(monkeypatch, ",".join(names)) as status:
        assert {status[n] for n in names} == {"applied"}
        assert status[counts.backend.name].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, new_step(model), 0))
        assert counts.computed == COMPRESSED


def test_the_cache_alone_serves_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only with the layer patch, which counts the runs, does the cache serve."""
    model = FlashMLAModel(counts)
    expected = run_step(model, new_step(model), 0)
    with registered_with(monkeypatch, counts.backend.name) as status:
        assert status[counts.backend.name] == "applied"
        assert status[counts.backend.layer_name].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, new_step(model), 0))
        assert counts.computed == COMPRESSED


# test_off_by_default: test_vllm_topk.py's, parametrized over every backend
