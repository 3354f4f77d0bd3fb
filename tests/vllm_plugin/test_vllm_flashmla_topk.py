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
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from test_vllm_topk import (
    COMPRESSED,
    DISTINCT,
    INDEX_SOURCES,
    KV_SOURCES,
    LAYERS,
    RATIOS,
    TOKENS,
    Launches,
    Model,
    index,
    same,
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
    real = module.compute_global_topk_indices_and_lens

    def compute_global_topk_indices_and_lens(
        topk_indices: torch.Tensor,
        token_to_req_indices: torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        is_valid_token: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        found.computed += 1
        result: tuple[torch.Tensor, torch.Tensor] = real(
            topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
        )
        return result

    monkeypatch.setattr(
        cache_utils, "_compute_global_topk_indices_and_lens_kernel", found.kernels
    )
    monkeypatch.setattr(
        module,
        "compute_global_topk_indices_and_lens",
        compute_global_topk_indices_and_lens,
    )
    monkeypatch.setattr(flashmla, "flash_mla_with_kvcache", found.decode)
    yield found


class FlashMLAModel(Model):
    """test_vllm_topk's model, of the backend's real layer class."""

    def __init__(self, backend: Backend) -> None:
        import importlib

        cls = getattr(importlib.import_module(_MODULES[backend.name]), backend.cls)
        self.backend = backend
        self.buffer = torch.full((TOKENS, 8), -1, dtype=torch.int32)
        self.kv_caches = {
            s: torch.zeros((8, 16, 16), dtype=torch.uint8)
            for r in KV_SOURCES.values()
            for s in r
        }
        self.layers = []
        for i, ratio in enumerate(RATIOS):
            layer = object.__new__(cls)
            layer.layer_id = i
            layer.compress_ratio = ratio
            layer.topk_indices_buffer = self.buffer
            # the real layer has an indexer object on index sources, None elsewhere
            layer.indexer = object() if i in INDEX_SOURCES else None
            layer.swa_cache_layer = types.SimpleNamespace(
                kv_cache=torch.zeros((4, 32, 16), dtype=torch.uint8)
            )
            layer.scale = 1.0
            layer.attn_sink = None
            layer.kv_source = max(
                (s for s in KV_SOURCES.get(ratio, ()) if s <= i), default=None
            )
            if layer.kv_source is not None:
                cache = self.kv_caches[layer.kv_source]
                layer._compressed_kv_cache = lambda c=cache: c
            self.layers.append(layer)


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
    counts: Counts,
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
        counts.layers += 1
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


def steps(model: FlashMLAModel, counts: Counts, seeds: range) -> list[list[Any]]:
    return [run_step(model, counts, new_step(model), seed) for seed in seeds]


# -- computations and launches per step, values ------------------------------------------
def test_stock_maps_the_top_k_in_every_compressed_layer(
    counts: Counts, stock: None
) -> None:
    model = FlashMLAModel(counts.backend)
    run_step(model, counts, new_step(model), 0)
    assert counts.now() == (COMPRESSED, COMPRESSED, LAYERS)
    assert counts.decode.count == (LAYERS if counts.backend is FLASHMLA else 0)


def test_the_plugin_computes_each_distinct_result_once_with_the_same_values(
    counts: Counts, register_plugin: Any
) -> None:
    model = FlashMLAModel(counts.backend)
    expected = steps(model, counts, range(3))  # stock: not registered yet
    plugin = register_plugin()
    backend = counts.backend
    assert {plugin.status()[n] for n in (backend.name, backend.layer_name)} == {
        "applied"
    }
    counts.reset()
    stepcache.reset_stats()
    per_step = []
    got = []
    for seed in range(3):
        before = counts.now()
        got.append(run_step(model, counts, new_step(model), seed))
        per_step.append(tuple(b - a for a, b in zip(before, counts.now(), strict=True)))
    # per step: 4 computations and 4 top-k launches where stock has 12 and 12; every
    # layer still decodes
    assert per_step == [(DISTINCT, DISTINCT, LAYERS)] * 3
    assert counts.decode.count == (3 * LAYERS if backend is FLASHMLA else 0)
    same(expected, got)
    row = stepcache.stats()[backend.name]
    assert (row.misses, row.hits) == (3 * DISTINCT, 3 * (COMPRESSED - DISTINCT))


def test_parity_mode_compares_every_call_with_stock(
    counts: Counts, register_plugin: Any
) -> None:
    model = FlashMLAModel(counts.backend)
    expected = steps(model, counts, range(2))
    plugin = register_plugin("verify")
    plugin.reset_counters()
    same(expected, steps(model, counts, range(2)))
    assert plugin.counters()[counts.backend.name] == {"verified": 2 * COMPRESSED}


def test_parity_mode_would_catch_a_stale_pair(
    counts: Counts, register_plugin: Any
) -> None:
    """An indexer run no patched layer announced makes a hit stale: parity mode says
    so, naming the patch (the run count is what keeps it fresh)."""
    model = FlashMLAModel(counts.backend)
    register_plugin("verify")
    step = new_step(model)
    run_step(model, counts, step, 0, layers=range(1, 2))
    index(model.buffer, 1, 5)
    with pytest.raises(stepcache.StaleCacheError, match=counts.backend.name):
        run_step(model, counts, step, 0, layers=range(3, 4), indexers=False)


@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_modes_find_nothing(
    counts: Counts, register_plugin: Any, mode: str
) -> None:
    model = FlashMLAModel(counts.backend)
    expected = steps(model, counts, range(2))
    register_plugin()
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        got = steps(model, counts, range(2))
    same(expected, got)
    assert list(stepcache.debug_report()) == []


# -- invalidation ------------------------------------------------------------------------
def test_the_same_metadata_in_the_next_run_recomputes(
    counts: Counts, register_plugin: Any
) -> None:
    """One metadata object across runs (no new object, no clear()): each source's new
    run, unseen by version counters, recomputes; layer 8 is SWA-only and yet counts."""
    model = FlashMLAModel(counts.backend)
    step = new_step(model)
    expected = [run_step(model, counts, step, seed) for seed in range(3)]
    register_plugin()
    counts.reset()
    step = new_step(model)
    got = [run_step(model, counts, step, seed) for seed in range(3)]
    same(expected, got)
    assert counts.computed == 3 * DISTINCT


def test_a_draft_step_with_vllms_clear_recomputes(
    counts: Counts, register_plugin: Any
) -> None:
    """vLLM's draft step rewrites ``token_to_req_indices`` and ``is_valid_token`` in
    place, then clears ``flashinfer_sparse_index_cache`` (the SWA builder's, for
    every backend); no indexer runs."""
    model = FlashMLAModel(counts.backend)
    tail = range(9, LAYERS)

    def draft(step: Step) -> None:
        step.swa.token_to_req_indices.numpy()[:] = [0, 1, 1, 2, 2, 2]
        step.swa.is_valid_token.numpy()[:] = [True] * 4 + [False] * 2
        step.swa.flashinfer_sparse_index_cache.clear()

    stock_step = new_step(model)
    expected = [run_step(model, counts, stock_step, 0)]
    draft(stock_step)
    expected.append(run_step(model, counts, stock_step, 0, tail, indexers=False))
    register_plugin()
    counts.reset()
    step = new_step(model)
    got = [run_step(model, counts, step, 0)]
    assert counts.computed == DISTINCT
    draft(step)
    got.append(run_step(model, counts, step, 0, tail, indexers=False))
    same(expected, got)
    assert counts.computed == DISTINCT + 2  # layers 9-15: two KV sources
    run_step(model, counts, step, 0, tail, indexers=False)  # nothing changed since
    assert counts.computed == DISTINCT + 2


def test_calls_outside_a_patched_decode_are_vllms(
    counts: Counts, register_plugin: Any
) -> None:
    import importlib

    register_plugin()
    module = importlib.import_module(_MODULES[counts.backend.name])
    model = FlashMLAModel(counts.backend)
    step = new_step(model)
    args = (
        model.buffer,
        step.swa.token_to_req_indices,
        step.flashmla[1].block_table,
        16,
        step.swa.is_valid_token,
    )
    first = module.compute_global_topk_indices_and_lens(*args)
    second = module.compute_global_topk_indices_and_lens(*args)
    assert counts.computed == 2 and first[0] is not second[0]
    same(first, second)


def test_another_backends_patches_serve_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every backend's pair of patches but this one's: its layers compute as stock's
    (a call named for one module's function is not another's)."""
    from conftest import import_patched_modules

    from stepcache.integrations import vllm as plugin_module
    from stepcache.integrations.vllm.global_topk import BACKENDS

    model = FlashMLAModel(counts.backend)
    expected = run_step(model, counts, new_step(model), 0)
    import_patched_modules()
    others = [b for b in BACKENDS if b is not counts.backend]
    names = [n for b in others for n in (b.name, b.layer_name)]
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.setenv(plugin_module.ADD_ENV, ",".join(names))
    plugin_module.register()
    try:
        status = plugin_module.status()
        assert {status[n] for n in names} == {"applied"}
        assert status[counts.backend.name].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, counts, new_step(model), 0))
        assert counts.computed == COMPRESSED
    finally:
        plugin_module.unregister()


def test_the_cache_alone_serves_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only with the layer patch, which counts the runs, does the cache serve."""
    from conftest import import_patched_modules

    from stepcache.integrations import vllm as plugin_module

    model = FlashMLAModel(counts.backend)
    expected = run_step(model, counts, new_step(model), 0)
    import_patched_modules()
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.setenv(plugin_module.ADD_ENV, counts.backend.name)
    plugin_module.register()
    try:
        status = plugin_module.status()
        assert status[counts.backend.name] == "applied"
        assert status[counts.backend.layer_name].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, counts, new_step(model), 0))
        assert counts.computed == COMPRESSED
    finally:
        plugin_module.unregister()


def test_off_by_default(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from conftest import import_patched_modules

    from stepcache.integrations import vllm as plugin_module

    import_patched_modules()
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.delenv(plugin_module.ADD_ENV, raising=False)
    plugin_module.register()
    try:
        for name in (counts.backend.name, counts.backend.layer_name):
            assert plugin_module.status()[name] == (
                f"skipped: off by default ({plugin_module.ADD_ENV}={name} applies it)"
            )
    finally:
        plugin_module.unregister()
