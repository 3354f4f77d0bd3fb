# SPDX-License-Identifier: Apache-2.0
"""(b) FlashInfer's decode with an FP4 KV cache, on SGLang 0.5.23's real
``MHATokenToKVPool``: each layer's ``get_flashinfer_decode_dequant_workspace_kv_buffer``
reads the pass's request rows and lengths to the host again (``_to_cpu_int_list``:
``.cpu().tolist()``, a device sync on a GPU). Faked at the boundary, as a CPU has no
FP4 kernel: the pool's buffers are made here (``__new__`` and its attributes, no
server) and its quant method's ``dequantize_prev_kv`` is a stand-in; the pool's own
methods run as shipped. The scope is the forward pass's (``ModelRunner.forward``,
patched off by default with the host-rows cache: ``STEPCACHE_SGLANG_ADD``)."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import Counting
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.model_executor.model_runner import ModelRunner

import stepcache
from stepcache.integrations.sglang.fp4 import HOST_ROWS_NAME
from stepcache.integrations.sglang.scopes import FORWARD_NAME

LAYERS, TOKENS, HEADS, DIM = 6, 64, 2, 8
#: three requests of the batch (rows of req_to_token) and their lengths, one empty
ROWS, LENS = [2, 0, 3], [5, 0, 9]


class FakeFP4:
    """The FP4 quant method's boundary: its kernel is CUDA's; this one widens each
    packed byte to two values and scales them, so a wrong row shows."""

    def scale_buffer_view_dtype(self) -> None:
        return None

    def dequantize_prev_kv(
        self,
        k: torch.Tensor,
        k_scale: torch.Tensor,
        v: torch.Tensor,
        v_scale: torch.Tensor,
        layer_id: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def widen(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            return x.float().repeat_interleave(2, dim=-1) * s + layer_id

        return widen(k, k_scale), widen(v, v_scale)


def fp4_pool() -> Any:
    """SGLang's pool class, with an FP4 KV cache's buffers."""
    pool: Any = MHATokenToKVPool.__new__(MHATokenToKVPool)
    g = torch.Generator().manual_seed(0)

    def packed() -> list[torch.Tensor]:
        shape = (TOKENS, HEADS, DIM // 2)
        return [torch.randint(0, 255, shape, dtype=torch.uint8, generator=g)] * LAYERS

    def scales() -> list[torch.Tensor]:
        return [torch.rand(TOKENS, HEADS, 1, generator=g) for _ in range(LAYERS)]

    pool.start_layer = 0
    pool.k_buffer, pool.v_buffer = packed(), packed()
    pool.k_scale_buffer, pool.v_scale_buffer = scales(), scales()
    pool.quant_method = FakeFP4()
    pool.dq_k_buffer = torch.zeros(TOKENS, HEADS, DIM)
    pool.dq_v_buffer = torch.zeros(TOKENS, HEADS, DIM)
    return pool


def batch() -> types.SimpleNamespace:
    """What a decode pass hands the pool: its request rows (on the device in SGLang)
    and host lengths, made under inference mode as SGLang's batches are."""
    with torch.inference_mode():
        return types.SimpleNamespace(
            req_pool_indices=torch.tensor(ROWS),
            seq_lens_cpu=torch.tensor(LENS, dtype=torch.int32),
        )


REQ_TO_TOKEN = torch.arange(4 * 16).reshape(4, 16) % TOKENS


def decode_pass(pool: Any, step: types.SimpleNamespace) -> list[Any]:
    """Every layer's workspace, as ``FlashInferAttnBackend.forward_decode`` asks it."""
    out = []
    for layer_id in range(LAYERS):
        layer = types.SimpleNamespace(
            layer_id=layer_id, tp_k_head_num=HEADS, tp_v_head_num=HEADS, head_dim=DIM
        )
        k, v = pool.get_flashinfer_decode_dequant_workspace_kv_buffer(
            layer, REQ_TO_TOKEN, step.req_pool_indices, step.seq_lens_cpu
        )
        out.append((k.clone(), v.clone()))
    return out


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """SGLang's ``_to_cpu_int_list``, counted by a wrapper installed before the
    plugin registers (it keeps the function it finds)."""
    seen = {"lists": 0}
    stock: Callable[[Any], list[int]] = MHATokenToKVPool._to_cpu_int_list

    @functools.wraps(stock)
    def counted(values: Any) -> list[int]:
        seen["lists"] += 1
        return stock(values)

    monkeypatch.setattr(MHATokenToKVPool, "_to_cpu_int_list", staticmethod(counted))
    return seen


def registered(plugin: Any, monkeypatch: pytest.MonkeyPatch, mode: str = "1") -> None:
    monkeypatch.setenv(plugin.ENV, mode)
    monkeypatch.setenv(plugin.ADD_ENV, "all")
    plugin.register()
    status = plugin.status()
    assert status[HOST_ROWS_NAME] == status[FORWARD_NAME] == "applied", status


def test_stock_reads_the_rows_in_every_layer(
    sglang_plugin: Any, computed: dict[str, int]
) -> None:
    with Counting() as counted:
        decode_pass(fp4_pool(), batch())
    assert computed["lists"] == 2 * LAYERS
    assert counted.calls.get("tolist", 0) == 2 * LAYERS


@pytest.mark.parametrize("mode", ["1", "verify"])
def test_in_a_pass_the_plugin_reads_them_once_with_the_same_workspaces(
    sglang_plugin: Any,
    computed: dict[str, int],
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
) -> None:
    step = batch()
    expected = decode_pass(fp4_pool(), step)
    registered(sglang_plugin, monkeypatch, mode)
    computed["lists"] = 0
    stepcache.reset_stats()
    with stepcache.scope(), Counting() as counted:  # the pass's, as ModelRunner's
        ours = decode_pass(fp4_pool(), step)
    assert stepcache.first_difference(expected, ours) is None
    if mode == "1":
        assert computed["lists"] == 2
        assert counted.calls.get("tolist", 0) == 2
        row = stepcache.stats()[HOST_ROWS_NAME]
        assert (row.misses, row.hits) == (2, 2 * LAYERS - 2)
    else:  # verify mode computes stock's lists too, and compares
        assert computed["lists"] >= 2 * LAYERS
        assert sglang_plugin.counters()[HOST_ROWS_NAME]["verified"] == 2 * LAYERS


def test_outside_a_pass_and_for_lists_sglang_computes(
    sglang_plugin: Any, computed: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    registered(sglang_plugin, monkeypatch)
    computed["lists"] = 0
    decode_pass(fp4_pool(), batch())  # no scope: every call is SGLang's
    assert computed["lists"] == 2 * LAYERS
    with stepcache.scope():
        assert MHATokenToKVPool._to_cpu_int_list([1, 2]) == [1, 2]
        assert MHATokenToKVPool._to_cpu_int_list([1, 2]) == [1, 2]
    assert computed["lists"] == 2 * LAYERS + 2


def test_rows_written_in_place_for_the_next_pass_are_read_again(
    sglang_plugin: Any, computed: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A persistent buffer (CUDA-graph replay reuses one) written between passes:
    each pass is its own scope, so the next one reads the new rows."""
    registered(sglang_plugin, monkeypatch)
    step = batch()
    with stepcache.scope():
        decode_pass(fp4_pool(), step)
    with torch.inference_mode():
        step.req_pool_indices[:] = torch.tensor([1, 3, 0])
        step.seq_lens_cpu[:] = torch.tensor([7, 2, 0], dtype=torch.int32)
    with stepcache.scope():
        ours = decode_pass(fp4_pool(), step)
    sglang_plugin.unregister()
    assert stepcache.first_difference(decode_pass(fp4_pool(), step), ours) is None


@pytest.mark.parametrize("debug", ["checks", "verify"])
def test_debug_modes_find_nothing_in_a_pass(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch, debug: str
) -> None:
    registered(sglang_plugin, monkeypatch)
    step = batch()
    expected = decode_pass(fp4_pool(), step)
    with stepcache.debug(debug), stepcache.scope():
        ours = decode_pass(fp4_pool(), step)
    assert stepcache.first_difference(expected, ours) is None


def test_the_forward_pass_opens_the_scope(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ModelRunner.forward`` as shipped, stood in by one of its signature that
    records the scope it runs in (the plugin wraps the function it finds)."""
    stock = ModelRunner.forward
    seen: list[object] = []

    @functools.wraps(stock)
    def forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(stepcache.active_scope())
        return forward_batch

    monkeypatch.setattr(ModelRunner, "forward", forward)
    registered(sglang_plugin, monkeypatch)
    runner = ModelRunner.__new__(ModelRunner)
    assert runner.forward("batch") == "batch"
    assert runner.forward("batch", split_forward_count=2) == "batch"
    assert len(seen) == 2 and all(s is not None for s in seen)
    assert seen[0] is not seen[1]  # a scope per pass
    assert sglang_plugin.counters()[FORWARD_NAME] == {"scopes": 2}
    sglang_plugin.unregister()
    assert ModelRunner.forward is forward


def test_a_tensor_given_a_dead_ones_id_is_read_anew(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key tells the pass's tensors apart by id; the entry serves only the tensor
    it was computed for, so a new tensor at a dead one's address and id (what fools an
    ``id()``-keyed cache, issue (d)) gets its own rows."""
    registered(sglang_plugin, monkeypatch)
    rows = MHATokenToKVPool._to_cpu_int_list
    with stepcache.scope():
        first = [torch.tensor([i, i]) for i in range(500)]
        assert [rows(t) for t in first] == [[i, i] for i in range(500)]
        by_id = {id(t): t.tolist() for t in first}  # a cache keyed by id() alone
        dead = set(by_id)
        del first
        later = [torch.tensor([-i]) for i in range(2000)]  # ids handed out again
        reused = [(i, t) for i, t in enumerate(later) if id(t) in dead]
        assert reused, "no tensor got a dead one's id"
        assert all(rows(t) == [-i] for i, t in reused)
        assert all(by_id[id(t)] != [-i] for i, t in reused)  # it would serve the dead
