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
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

import stepcache
from stepcache.integrations.vllm.global_topk import (
    GLOBAL_TOPK_LAYER_NAME,
    GLOBAL_TOPK_NAME,
)

pytestmark = pytest.mark.vllm

NAMES = (GLOBAL_TOPK_LAYER_NAME, GLOBAL_TOPK_NAME)
LAYERS = 16
#: 0: SWA only; 1 and 2: compressed (every fourth layer SWA-only, then 1, 2, 1)
RATIOS = [0 if i % 4 == 0 else (1 if i % 2 else 2) for i in range(LAYERS)]
#: layer 8 is SWA-only yet an index source: its run must invalidate too
INDEX_SOURCES = (1, 8)
#: ratio-1 layers all read layer 1's compressed cache: under both index sources, so
#: only the source's run tells their top-k apart
KV_SOURCES = {1: (1,), 2: (2, 10)}
COMPRESSED = sum(r > 0 for r in RATIOS)  # 12 layers map the top-k each step
#: (index source, KV source) pairs among the compressed layers: distinct results
DISTINCT = 4
TOPK = 8
#: three requests of two tokens each (a speculative decode), the last one padding
REQS, TOKENS = 3, 6


def i32(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


class Launches:
    """A Triton kernel behind a counter of its launches (``kernel[grid](...)``)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.count = 0

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return launch(*args, **kwargs)

        return counted


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
    real = flashinfer_sparse.compute_global_topk_indices_and_lens

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
        flashinfer_sparse,
        "compute_global_topk_indices_and_lens",
        compute_global_topk_indices_and_lens,
    )
    monkeypatch.setattr(
        flashinfer_sparse,
        "flashinfer_trtllm_batch_decode_sparse_mla_dsv4",
        found.decode,
    )
    yield found


# -- a small DeepSeek V4.1 ---------------------------------------------------------------
class Model:
    """The layers, the shared top-k buffer, and each KV source's cache and metadata."""

    def __init__(self) -> None:
        from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

        self.buffer = torch.full((TOKENS, TOPK), -1, dtype=torch.int32)
        workspace = torch.zeros(16, dtype=torch.uint8)
        self.layers: list[Any] = []
        for i, ratio in enumerate(RATIOS):
            layer = object.__new__(flashinfer_sparse.DeepseekV4FlashInferSM120Attention)
            layer.layer_id = i
            layer.compress_ratio = ratio
            layer.topk_indices_buffer = self.buffer
            # the real layer has an indexer object on index sources, None elsewhere
            layer.indexer = object() if i in INDEX_SOURCES else None
            layer.swa_cache_layer = types.SimpleNamespace(
                kv_cache=torch.zeros((4, 32, 16), dtype=torch.uint8)
            )
            layer.kv_cache_torch_dtype = torch.bfloat16
            layer.scale = 1.0
            layer.attn_sink = None
            layer._get_workspace = lambda device, w=workspace: w
            layer.kv_source = max(
                (s for s in KV_SOURCES.get(ratio, ()) if s <= i), default=None
            )
            self.layers.append(layer)
        self.kv_caches = {
            s: torch.zeros((8, 16, 16), dtype=torch.uint8)
            for r in KV_SOURCES.values()
            for s in r
        }

    def flashmla(self) -> dict[int, Any]:
        """Each KV source's metadata for a step: its own block table."""
        from vllm.models.deepseek_v41.sparse_mla import DeepseekV4FlashMLAMetadata

        qsl = i32([0, 2, 4, 6])
        return {
            s: DeepseekV4FlashMLAMetadata(
                num_reqs=REQS,
                max_query_len=2,
                max_seq_len=40,
                num_actual_tokens=TOKENS,
                query_start_loc=qsl,
                slot_mapping=torch.arange(TOKENS),
                block_table=i32(
                    [[s * 100 + r * 10 + b for b in range(6)] for r in range(REQS)]
                ),
                req_id_per_token=i32([0, 0, 1, 1, 2, 2]),
                block_size=16,
                topk_tokens=TOPK,
            )
            for s in self.kv_caches
        }


def swa_metadata() -> Any:
    """A decode step's SWA metadata (vLLM's class): three requests, two tokens each,
    the last token padding."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    return DeepseekSparseSWAMetadata(
        block_table=i32([[0, 1], [2, 3], [4, 5]]),
        slot_mapping=torch.tensor([0, 1, 2, 3, 4, -1]),
        block_size=32,
        seq_lens=i32([30, 35, 40]),
        query_start_loc=i32([0, 2, 4, 6]),
        query_start_loc_cpu=i32([0, 2, 4, 6]),
        token_to_req_indices=i32([0, 0, 1, 1, 2, 2]),
        decode_swa_indices=i32([[t, t + 1, -1, -1] for t in range(TOKENS)]),
        decode_swa_lens=i32([2] * TOKENS),
        decode_swa_width=4,
        is_valid_token=torch.tensor([True] * 5 + [False]),
        num_decodes=REQS,
        num_prefills=0,
        num_decode_tokens=TOKENS,
        num_prefill_tokens=0,
    )


def index(buffer: torch.Tensor, step: int, layer: int) -> None:
    """What an index source's indexer does to the shared buffer: rewrites it in place,
    unseen by torch's version counter (as a Triton kernel's write)."""
    version = buffer._version
    rows = [
        [
            (step * 7 + layer * 3 + t * 5 + j) % 40 if j < 3 + (t + layer) % 4 else -1
            for j in range(TOPK)
        ]
        for t in range(TOKENS)
    ]
    buffer.numpy()[:] = np.asarray(rows, dtype=np.int32)
    assert buffer._version == version


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


def steps(model: Model, seeds: range) -> list[list[torch.Tensor]]:
    return [run_step(model, new_step(model), seed) for seed in seeds]


def same(expected: Any, got: Any) -> None:
    assert stepcache.first_difference(expected, got) is None


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
    counts: Counts, register_plugin: Any
) -> None:
    assert counts.kernels is not None and counts.decode is not None
    model = Model()
    expected = steps(model, range(3))  # stock: the plugin not registered yet
    stock_seen = list(counts.decode.seen)
    plugin = register_plugin()
    assert {plugin.status()[name] for name in NAMES} == {"applied"}
    counts.reset()
    stepcache.reset_stats()
    per_step = []
    got = []
    for seed in range(3):
        before = (counts.computed, counts.kernels.count, counts.decode.count)
        got.append(run_step(model, new_step(model), seed))
        after = (counts.computed, counts.kernels.count, counts.decode.count)
        per_step.append(tuple(b - a for a, b in zip(before, after, strict=True)))
    # per step: 4 computations and 4 top-k launches where stock has 12 and 12; the
    # attention launches are the same 16
    assert per_step == [(DISTINCT, DISTINCT, LAYERS)] * 3
    same(expected, got)
    same(stock_seen, counts.decode.seen)  # the very indices each layer attends with
    row = stepcache.stats()[GLOBAL_TOPK_NAME]
    assert (row.misses, row.hits) == (3 * DISTINCT, 3 * (COMPRESSED - DISTINCT))


def test_parity_mode_compares_every_call_with_stock(
    counts: Counts, register_plugin: Any
) -> None:
    model = Model()
    expected = steps(model, range(2))
    plugin = register_plugin("verify")
    plugin.reset_counters()
    same(expected, steps(model, range(2)))
    assert plugin.counters()[GLOBAL_TOPK_NAME] == {"verified": 2 * COMPRESSED}


def test_parity_mode_would_catch_a_stale_pair(
    counts: Counts, register_plugin: Any
) -> None:
    """Without the layer patch's run count (an indexer run it did not see), a hit is
    stale: parity mode says so, naming the patch."""
    model = Model()
    register_plugin("verify")
    step = new_step(model)
    run_step(model, step, 0, layers=range(1, 2))
    index(model.buffer, 1, 5)  # a rewrite no patched layer announced
    with pytest.raises(stepcache.StaleCacheError, match=GLOBAL_TOPK_NAME):
        run_step(model, step, 0, layers=range(3, 4), indexers=False)


# -- (4) debug modes -------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["checks", "verify"])
def test_debug_modes_find_nothing(
    counts: Counts, register_plugin: Any, mode: str
) -> None:
    model = Model()
    expected = steps(model, range(2))
    register_plugin()
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        got = steps(model, range(2))
    same(expected, got)
    assert list(stepcache.debug_report()) == []


def test_with_caching_off_every_layer_computes(
    counts: Counts, register_plugin: Any
) -> None:
    model = Model()
    expected = steps(model, range(1))
    register_plugin()
    counts.reset()
    with stepcache.disabled():
        same(expected, steps(model, range(1)))
    assert counts.computed == COMPRESSED


# -- (5) invalidation --------------------------------------------------------------------
def test_each_index_source_run_invalidates_even_a_swa_only_one(
    counts: Counts, register_plugin: Any
) -> None:
    """Layers 1-7 read source 1's indices, 9-15 source 8's (SWA-only, so it never
    computes a top-k itself): a hand cache cleared by the source's own top-k call
    would hand layers 9-15 source 1's pairs."""
    model = Model()
    expected = run_step(model, new_step(model), 0)
    register_plugin()
    counts.reset()
    got = run_step(model, new_step(model), 0)
    same(expected, got)
    # two per source (its two KV sources), layer 1's compressed cache under both
    assert counts.computed == DISTINCT


def test_the_same_metadata_in_the_next_run_recomputes(
    counts: Counts, register_plugin: Any
) -> None:
    """A metadata object kept across steps (no new object, no clear()): the sources'
    new runs, unseen by version counters, still recompute."""
    model = Model()
    step = new_step(model)
    expected = [run_step(model, step, seed) for seed in range(3)]
    register_plugin()
    counts.reset()
    step = new_step(model)
    got = [run_step(model, step, seed) for seed in range(3)]
    same(expected, got)
    assert counts.computed == 3 * DISTINCT


def test_a_draft_step_with_vllms_clear_recomputes(
    counts: Counts, register_plugin: Any
) -> None:
    """vLLM's draft step rewrites ``token_to_req_indices`` and ``is_valid_token`` in
    place (unseen here, through numpy), then calls
    ``flashinfer_sparse_index_cache.clear()``; no indexer runs. The layers after the
    last source (MTP-like consumers) must read the new mapping."""
    model = Model()
    tail = range(9, LAYERS)

    def draft(step: Step) -> None:
        step.swa.token_to_req_indices.numpy()[:] = [0, 1, 1, 2, 2, 2]
        step.swa.is_valid_token.numpy()[:] = [True] * 4 + [False] * 2
        step.swa.flashinfer_sparse_index_cache.clear()

    stock_step = new_step(model)
    expected = [run_step(model, stock_step, 0)]
    draft(stock_step)
    expected.append(run_step(model, stock_step, 0, tail, indexers=False))
    register_plugin()
    counts.reset()
    step = new_step(model)
    got = [run_step(model, step, 0)]
    assert counts.computed == DISTINCT
    draft(step)
    got.append(run_step(model, step, 0, tail, indexers=False))
    same(expected, got)
    assert counts.computed == DISTINCT + 2  # layers 9-15: two KV sources
    run_step(model, step, 0, tail, indexers=False)  # nothing changed since
    assert counts.computed == DISTINCT + 2


def test_calls_outside_a_patched_decode_are_vllms(
    counts: Counts, register_plugin: Any
) -> None:
    from vllm.models.deepseek_v41.nvidia import flashinfer_sparse

    register_plugin()
    model = Model()
    step = new_step(model)
    args = (
        model.buffer,
        step.swa.token_to_req_indices,
        step.flashmla[1].block_table,
        16,
        step.swa.is_valid_token,
    )
    first = flashinfer_sparse.compute_global_topk_indices_and_lens(*args)
    second = flashinfer_sparse.compute_global_topk_indices_and_lens(*args)
    assert counts.computed == 2 and first[0] is not second[0]
    same(first, second)


def test_the_cache_alone_serves_nothing(
    counts: Counts, vllm_mod: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only with the layer patch, which counts the runs, does the cache serve."""
    from conftest import import_patched_modules

    from stepcache.integrations import vllm as plugin_module

    model = Model()
    expected = run_step(model, new_step(model), 0)
    import_patched_modules()
    monkeypatch.setenv(plugin_module.ENV, "1")
    monkeypatch.setenv(plugin_module.ADD_ENV, GLOBAL_TOPK_NAME)
    plugin_module.register()
    try:
        status = plugin_module.status()
        assert status[GLOBAL_TOPK_NAME] == "applied"
        assert status[GLOBAL_TOPK_LAYER_NAME].startswith("skipped: off by default")
        counts.reset()
        same(expected, run_step(model, new_step(model), 0))
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
        for name in NAMES:
            assert plugin_module.status()[name] == (
                f"skipped: off by default ({plugin_module.ADD_ENV}={name} applies it)"
            )
    finally:
        plugin_module.unregister()
