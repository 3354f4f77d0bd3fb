# SPDX-License-Identifier: Apache-2.0
"""A small DeepSeek V4.1, shared by the tests of its decode caches (test_vllm_topk.py,
test_vllm_mixed_sparse.py, test_vllm_flashmla_topk.py).

Sixteen layers of one of vLLM's real attention classes, built without ``__init__``: a
shared ``topk_indices_buffer``, two index sources (layer 1, compressed, and layer 8,
SWA-only), four KV sources (two per compress ratio). An indexer's run is what the real
one does to the buffer: a rewrite in place that moves no torch version counter (here
through a numpy view). Each test file says how its layers run a step (a ``Harness``);
the flows here run stock and the plugin alike, check the values are the same, and
hand back the counts for the test to assert."""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import torch

import stepcache

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


def same(expected: Any, got: Any) -> None:
    assert stepcache.first_difference(expected, got) is None


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


def counted_global_topk(
    real: Callable[..., tuple[torch.Tensor, torch.Tensor]], counts: Any
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """vLLM's ``compute_global_topk_indices_and_lens`` (``real``), adding one to
    ``counts.computed`` a call."""

    def compute_global_topk_indices_and_lens(
        topk_indices: torch.Tensor,
        token_to_req_indices: torch.Tensor,
        block_table: torch.Tensor,
        block_size: int,
        is_valid_token: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        counts.computed += 1
        return real(
            topk_indices, token_to_req_indices, block_table, block_size, is_valid_token
        )

    return compute_global_topk_indices_and_lens


# -- the model ---------------------------------------------------------------------------
def kv_caches() -> dict[int, torch.Tensor]:
    """Each KV source's compressed cache."""
    return {
        s: torch.zeros((8, 16, 16), dtype=torch.uint8)
        for r in KV_SOURCES.values()
        for s in r
    }


def new_layers(cls: type, buffer: torch.Tensor) -> list[Any]:
    """The layers, of vLLM's class ``cls``, on the shared top-k ``buffer``: what every
    backend reads (``kv_source``, None on SWA-only layers, is this harness's)."""
    layers = []
    for i, ratio in enumerate(RATIOS):
        layer = object.__new__(cls)
        layer.layer_id = i
        layer.compress_ratio = ratio
        layer.topk_indices_buffer = buffer
        # the real layer has an indexer object on index sources, None elsewhere
        layer.indexer = object() if i in INDEX_SOURCES else None
        layer.swa_cache_layer = types.SimpleNamespace(
            prefix=f"layers.{i}.swa",
            kv_cache=torch.zeros((4, 32, 16), dtype=torch.uint8),
        )
        layer.kv_cache_torch_dtype = torch.bfloat16
        layer.scale = 1.0
        layer.attn_sink = None
        layer.kv_source = max(
            (s for s in KV_SOURCES.get(ratio, ()) if s <= i), default=None
        )
        layers.append(layer)
    return layers


def flashmla_metadata(source: int) -> Any:
    """A KV source's metadata for a step (vLLM's class): its own block table."""
    from vllm.models.deepseek_v41.sparse_mla import DeepseekV4FlashMLAMetadata

    return DeepseekV4FlashMLAMetadata(
        num_reqs=REQS,
        max_query_len=2,
        max_seq_len=40,
        num_actual_tokens=TOKENS,
        query_start_loc=i32([0, 2, 4, 6]),
        slot_mapping=torch.arange(TOKENS),
        block_table=i32(
            [[source * 100 + r * 10 + b for b in range(6)] for r in range(REQS)]
        ),
        req_id_per_token=i32([0, 0, 1, 1, 2, 2]),
        block_size=16,
        topk_tokens=TOPK,
    )


def swa_metadata(**fields: Any) -> Any:
    """A decode step's SWA metadata (vLLM's class): three requests, two tokens each,
    the last token padding; ``fields`` replace or add to the defaults."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    defaults: dict[str, Any] = dict(
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
    return DeepseekSparseSWAMetadata(**{**defaults, **fields})


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


def draft(swa: Any) -> None:
    """vLLM's draft step: rewrites ``token_to_req_indices`` and ``is_valid_token`` in
    place (unseen here, through numpy), then clears ``flashinfer_sparse_index_cache``;
    no indexer runs."""
    swa.token_to_req_indices.numpy()[:] = [0, 1, 1, 2, 2, 2]
    swa.is_valid_token.numpy()[:] = [True] * 4 + [False] * 2
    swa.flashinfer_sparse_index_cache.clear()


# -- the flows ---------------------------------------------------------------------------
@dataclasses.dataclass
class Harness:
    """How a test file's layers run: ``model()`` builds the model (with ``buffer`` and
    ``layers``), ``new_step(model)`` a step's metadata (with ``swa``),
    ``run_step(model, step, seed, layers, indexers)`` a decode step through ``layers``,
    an index source's indexer before its attention, and returns each layer's output;
    ``calls()`` counts the calls of the cached vLLM function, ``reset()`` the
    counters."""

    model: Callable[[], Any]
    new_step: Callable[[Any], Any]
    run_step: Callable[..., list[Any]]
    calls: Callable[[], int]
    reset: Callable[[], None]

    def steps(self, model: Any, seeds: range) -> list[list[Any]]:
        return [self.run_step(model, self.new_step(model), seed) for seed in seeds]

    def per_step(
        self, model: Any, now: Callable[[], tuple[int, ...]], seeds: range
    ) -> tuple[list[list[Any]], list[tuple[int, ...]]]:
        """A new step per seed: the outputs, and what ``now()`` grew by in each."""
        got, grew = [], []
        for seed in seeds:
            before = now()
            got.append(self.run_step(model, self.new_step(model), seed))
            grew.append(tuple(b - a for a, b in zip(before, now(), strict=True)))
        return got, grew


def debug_report(h: Harness, register_plugin: Any, mode: str) -> list[Any]:
    """Two steps under ``stepcache.debug(mode)``, as stock's: its report."""
    model = h.model()
    expected = h.steps(model, range(2))
    register_plugin()
    stepcache.clear_debug_report()
    with stepcache.debug(mode):
        got = h.steps(model, range(2))
    same(expected, got)
    return list(stepcache.debug_report())


def parity_counters(h: Harness, register_plugin: Any) -> dict[str, Any]:
    """Two steps in parity mode, as stock's: the plugin's counters for them."""
    model = h.model()
    expected = h.steps(model, range(2))
    plugin = register_plugin("verify")
    plugin.reset_counters()
    same(expected, h.steps(model, range(2)))
    counters: dict[str, Any] = plugin.counters()
    return counters


def stale_pair(h: Harness, register_plugin: Any) -> Callable[[], Any]:
    """In parity mode, layer 1's step, then a rewrite no patched layer announced: the
    run of layer 3 (a hit, stale), to call."""
    model = h.model()
    register_plugin("verify")
    step = h.new_step(model)
    h.run_step(model, step, 0, range(1, 2))
    index(model.buffer, 1, 5)  # a rewrite no patched layer announced
    return lambda: h.run_step(model, step, 0, range(3, 4), indexers=False)


def calls_in_one_step(h: Harness, register_plugin: Any) -> int:
    """One step with the plugin, as stock's: the calls it made."""
    model = h.model()
    expected = h.run_step(model, h.new_step(model), 0)
    register_plugin()
    h.reset()
    same(expected, h.run_step(model, h.new_step(model), 0))
    return h.calls()


def calls_with_caching_off(h: Harness, register_plugin: Any) -> int:
    """One step with the plugin under ``stepcache.disabled()``: the calls it made."""
    model = h.model()
    expected = h.steps(model, range(1))
    register_plugin()
    h.reset()
    with stepcache.disabled():
        same(expected, h.steps(model, range(1)))
    return h.calls()


def calls_with_kept_metadata(h: Harness, register_plugin: Any) -> int:
    """Three runs on one metadata object (no new object, no clear()), as stock's: the
    calls they made."""
    model = h.model()
    step = h.new_step(model)
    expected = [h.run_step(model, step, seed) for seed in range(3)]
    register_plugin()
    h.reset()
    step = h.new_step(model)
    same(expected, [h.run_step(model, step, seed) for seed in range(3)])
    return h.calls()


def calls_around_a_draft(h: Harness, register_plugin: Any) -> tuple[int, int, int]:
    """A step, vLLM's draft step (``draft``), then layers 9-15 (after the last source,
    MTP-like consumers) twice, as stock's: the calls after the step, after the first
    run of layers 9-15, after the second (nothing changed since)."""
    model = h.model()
    tail = range(9, LAYERS)
    stock_step = h.new_step(model)
    expected = [h.run_step(model, stock_step, 0)]
    draft(stock_step.swa)
    expected.append(h.run_step(model, stock_step, 0, tail, indexers=False))
    register_plugin()
    h.reset()
    step = h.new_step(model)
    got = [h.run_step(model, step, 0)]
    first = h.calls()
    draft(step.swa)
    got.append(h.run_step(model, step, 0, tail, indexers=False))
    same(expected, got)
    second = h.calls()
    h.run_step(model, step, 0, tail, indexers=False)
    return first, second, h.calls()


def called_outside_a_decode(module: Any, buffer: torch.Tensor, step: Any) -> Any:
    """``module``'s global top-k called twice with one step's arguments, outside any
    patched decode: both results."""
    args = (
        buffer,
        step.swa.token_to_req_indices,
        step.flashmla[1].block_table,
        16,
        step.swa.is_valid_token,
    )
    fn = module.compute_global_topk_indices_and_lens
    return fn(*args), fn(*args)


@contextlib.contextmanager
def registered_with(
    monkeypatch: pytest.MonkeyPatch, add: str | None
) -> Iterator[dict[str, str]]:
    """The plugin registered with ``STEPCACHE_VLLM=1`` and the off-by-default patches
    ``add`` (None: none): its status; unregistered after."""
    from conftest import import_patched_modules

    from stepcache.integrations import vllm as plugin_module

    import_patched_modules()
    monkeypatch.setenv(plugin_module.ENV, "1")
    if add is None:
        monkeypatch.delenv(plugin_module.ADD_ENV, raising=False)
    else:
        monkeypatch.setenv(plugin_module.ADD_ENV, add)
    plugin_module.register()
    try:
        yield plugin_module.status()
    finally:
        plugin_module.unregister()
