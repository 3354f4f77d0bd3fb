# SPDX-License-Identifier: Apache-2.0
"""The SGLang plugin on SGLang 0.5.23's real classes: what a forward pass computes,
stock against the plugin (counted), and that the values are the same."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
import torch
from conftest import Counting
from passes import (
    GDN_LAYERS,
    forward_batch,
    gdn_backend,
    prepare_tbo,
    run_gdn_pass,
)
from sglang.srt.batch_overlap import two_batch_overlap as tbo
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

import stepcache
from stepcache.integrations.plugin import SwitchError
from stepcache.integrations.sglang import PLUGIN, gdn
from stepcache.integrations.sglang.fp4 import HOST_ROWS_NAME
from stepcache.integrations.sglang.scopes import FORWARD_NAME
from stepcache.integrations.sglang.tbo import SPLIT_TOKEN_NAME

GDN = gdn.INITIAL_STATE_NAME
ADD = "STEPCACHE_SGLANG_ADD"
STOCK_CONVOLVE = GDNAttnBackend._convolve_prefill
STOCK_SPLIT = vars(tbo.TboForwardBatchPreparer)["_compute_split_token_index"]


def same(a: Any, b: Any) -> bool:
    return stepcache.first_difference(a, b) is None


def conv_args(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(call) for call in calls]


def gdn_pass(
    mode: ForwardMode, boundary: types.SimpleNamespace
) -> tuple[dict[str, Any], list[dict[str, Any]], Counting]:
    boundary.conv_calls.clear()
    backend, batch = gdn_backend(), forward_batch(mode)
    with Counting() as counted:
        built = run_gdn_pass(backend, batch)
    return built, conv_args(boundary.conv_calls), counted


# -- the switch ------------------------------------------------------------------------
def test_sglangs_plugin_loader_finds_register() -> None:
    """SGLang's own loader, on the installed entry points, loads our register."""
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    from stepcache.integrations import sglang as plugin_module

    loaded = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
    assert loaded["stepcache"][0] is plugin_module.register


def test_off_by_default_nothing_is_patched(
    sglang_plugin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=PLUGIN.logger.name)
    sglang_plugin.register()
    assert GDNAttnBackend._convolve_prefill is STOCK_CONVOLVE
    assert set(sglang_plugin.status().values()) == {"off"}
    assert [r.getMessage() for r in caplog.records] == [
        "stepcache: STEPCACHE_SGLANG is not set to 1; SGLang left unpatched"
    ]


def test_a_bad_switch_value_is_a_typed_error_and_patches_nothing(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(SwitchError, match="STEPCACHE_SGLANG must be 0, 1, verify"):
        PLUGIN.parse_mode("yes please")
    monkeypatch.setenv("STEPCACHE_SGLANG", "2")
    sglang_plugin.register()
    assert GDNAttnBackend._convolve_prefill is STOCK_CONVOLVE
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    monkeypatch.setenv("STEPCACHE_SGLANG_SKIP", "sglang.no_such_patch")
    sglang_plugin.register()
    assert sglang_plugin.status()[GDN] == "off"


def test_register_is_reentrant_and_unregister_restores_sglang(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    patched = GDNAttnBackend._convolve_prefill
    sglang_plugin.register()
    assert GDNAttnBackend._convolve_prefill is patched is not STOCK_CONVOLVE
    off = f"skipped: off by default ({ADD}={{}} applies it)"
    assert sglang_plugin.status() == {
        GDN: "applied",
        SPLIT_TOKEN_NAME: "applied",
        FORWARD_NAME: off.format(FORWARD_NAME),
        HOST_ROWS_NAME: off.format(HOST_ROWS_NAME),
    }
    assert isinstance(
        vars(tbo.TboForwardBatchPreparer)["_compute_split_token_index"], classmethod
    )
    sglang_plugin.unregister()
    assert GDNAttnBackend._convolve_prefill is STOCK_CONVOLVE
    assert vars(tbo.TboForwardBatchPreparer)["_compute_split_token_index"] is (
        STOCK_SPLIT
    )


# -- (a) GDN: has_initial_state, once per pass -----------------------------------------
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_a_gdn_pass_computes_the_mask_once_with_the_same_values(
    mode: ForwardMode,
    sglang_plugin: Any,
    boundary: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stock_built, stock_conv, stock = gdn_pass(mode, boundary)
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    ours_built, ours_conv, ours = gdn_pass(mode, boundary)
    assert same(stock_built, ours_built)
    assert len(stock_conv) == len(ours_conv)
    for a, b in zip(stock_conv, ours_conv, strict=True):
        assert same(a, b)
    extend = mode == ForwardMode.EXTEND
    # the mask: once per GDN layer stock, once per pass with the plugin
    assert stock.calls.get("gt", 0) == (GDN_LAYERS if extend else 0)
    assert ours.calls.get("gt", 0) == (1 if extend else 0)
    assert stock.syncs() == ours.syncs()  # no host sync added, none removed here
    if extend:
        row = stepcache.stats()[GDN]
        assert (row.misses, row.hits) == (1, GDN_LAYERS - 1)
        assert stock_conv[0]["has_initial_state"].tolist() == [False, True, False, True]


@pytest.mark.parametrize("debug", ["checks", "verify"])
def test_debug_modes_find_nothing_in_a_gdn_pass(
    debug: str,
    sglang_plugin: Any,
    boundary: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    stepcache.clear_debug_report()
    with stepcache.debug(debug):
        gdn_pass(ForwardMode.EXTEND, boundary)
        children = prepare_tbo(forward_batch(ForwardMode.EXTEND, tbo=True))
    assert len(children) == 2
    assert list(stepcache.debug_report()) == []


def test_verify_mode_compares_each_layer_and_names_a_stale_mask(
    sglang_plugin: Any,
    boundary: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("STEPCACHE_SGLANG", "verify")
    sglang_plugin.register()
    gdn_pass(ForwardMode.EXTEND, boundary)
    assert sglang_plugin.counters()[GDN] == {"verified": GDN_LAYERS}
    backend, batch = gdn_backend(), forward_batch(ForwardMode.EXTEND)
    run_gdn_pass(backend, batch)
    # a write torch's version counter does not see: the cache would serve the old mask
    batch.extend_prefix_lens.numpy()[0] = 3
    with pytest.raises(stepcache.StaleCacheError, match=GDN):
        run_gdn_pass(backend, batch)


def test_a_new_prefix_tensor_recomputes_the_mask(
    sglang_plugin: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    batch = forward_batch(ForwardMode.EXTEND)
    first = gdn.initial_state(batch)
    batch.extend_prefix_lens = torch.tensor([1, 0, 0, 0], dtype=torch.int32)
    assert gdn.initial_state(batch).tolist() == [True, False, False, False]
    assert first.tolist() == [False, True, False, True]


# -- (c) two-batch overlap: the split token, once per parent batch ---------------------
@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.DECODE])
def test_a_tbo_split_computes_the_split_token_once_with_the_same_children(
    mode: ForwardMode,
    sglang_plugin: Any,
    boundary: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    computed: list[int] = []
    stock_fn = tbo.compute_split_token_index

    def counting(*args: Any, **kwargs: Any) -> int:
        computed.append(1)
        result: int = stock_fn(*args, **kwargs)
        return result

    monkeypatch.setattr(tbo, "compute_split_token_index", counting)

    def split() -> tuple[list[Any], int, Counting]:
        computed.clear()
        with Counting() as counted:
            children = prepare_tbo(forward_batch(mode, tbo=True))
        return children, len(computed), counted

    stock_children, stock_n, stock = split()
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    ours_children, ours_n, ours = split()
    assert (stock_n, ours_n) == (3, 1)
    assert stock.syncs() == ours.syncs()
    for a, b in zip(stock_children, ours_children, strict=True):
        assert same(vars(a), vars(b))
    assert [c.batch_size for c in ours_children] == [2, 2]


def test_a_tbo_forward_pass_builds_the_same_metadata_per_child(
    sglang_plugin: Any,
    boundary: types.SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def built() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        boundary.conv_calls.clear()
        children = prepare_tbo(forward_batch(ForwardMode.EXTEND, tbo=True))
        backend = gdn_backend()
        with Counting() as counted:
            metadata = [run_gdn_pass(backend, child) for child in children]
        return metadata, conv_args(boundary.conv_calls), counted.calls.get("gt", 0)

    stock_md, stock_conv, stock_masks = built()
    monkeypatch.setenv("STEPCACHE_SGLANG", "1")
    sglang_plugin.register()
    ours_md, ours_conv, ours_masks = built()
    assert same(stock_md, ours_md)
    assert all(same(a, b) for a, b in zip(stock_conv, ours_conv, strict=True))
    assert (stock_masks, ours_masks) == (2 * GDN_LAYERS, 2)


# -- (d) id()-keyed caches -------------------------------------------------------------
def test_an_id_keyed_cache_serves_a_dead_batchs_value_where_stepcache_does_not() -> (
    None
):
    """MiniMax's sparse backend keys its NPU extend metadata on ``id(forward_batch)``:
    a new batch at a dead one's address is served the dead one's lengths."""
    from sglang.srt.layers.attention.minimax_sparse_backend import (
        MiniMaxSparseAttnBackend,
    )

    backend = MiniMaxSparseAttnBackend.__new__(MiniMaxSparseAttnBackend)
    backend.is_npu, backend._extend_meta_key, backend._extend_meta = True, None, None
    q = torch.zeros(1)

    @stepcache.step_cached(
        depends_on=("extend_seq_lens",), name="test.sglang.cu_seqlens"
    )
    def cu_seqlens(batch: Any) -> torch.Tensor:
        lens = batch.extend_seq_lens.to(torch.int32)
        return torch.cat([lens.new_zeros(1), lens.cumsum(0).to(torch.int32)])

    dead = forward_batch(ForwardMode.EXTEND)
    backend._resolve_extend_meta(dead, q)
    cu_seqlens(dead)
    fields = dict(vars(forward_batch(ForwardMode.EXTEND)))
    dead_id = id(dead)
    del dead  # the pass is over; CPython gives its memory to the next object
    batch = ForwardBatch.__new__(ForwardBatch)
    if id(batch) != dead_id:
        pytest.skip("the new batch did not get the dead one's address")
    vars(batch).update(fields)
    batch.extend_seq_lens = torch.tensor([1, 1, 1, 1], dtype=torch.int32)
    served = backend._resolve_extend_meta(batch, q)[0]
    assert served.tolist() == [0, 4, 7, 10, 14]  # the dead batch's
    assert cu_seqlens(batch).tolist() == [0, 1, 2, 3, 4]  # this batch's
