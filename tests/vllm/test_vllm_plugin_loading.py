# SPDX-License-Identifier: Apache-2.0
"""The plugin loads through vLLM's own plugin loader and entry point, idempotently,
and leaves a target of an unexpected shape alone."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Iterator
from types import ModuleType

import pytest

pytestmark = pytest.mark.vllm


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    # vLLM's logging setup stops "vllm.*" records at its own logger: listen on ours.
    from stepcache.integrations import vllm as plugin

    logger = plugin.logger
    old = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.level, logger.propagate = old


@pytest.fixture
def fresh_loader(
    vllm_mod: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """vLLM's plugin loader as in a new process: nothing loaded yet, no allow-list."""
    # the patched modules are imported first, so register() applies every patch now
    import vllm.models.deepseek_v4.compressor
    import vllm.models.deepseek_v4.nvidia.flashinfer_sparse  # noqa: F401
    import vllm.plugins

    from stepcache.integrations import vllm as plugin

    plugin.unregister()
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    monkeypatch.delenv(plugin.ENV, raising=False)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    yield vllm.plugins
    plugin.unregister()


def test_the_entry_point_names_register(vllm_mod: ModuleType) -> None:
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    ours = [p for p in points if p.name == "stepcache"]
    assert [p.value for p in ours] == ["stepcache.integrations.vllm:register"]


def test_vllms_loader_registers_the_plugin_once_however_often_it_runs(
    fresh_loader: ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from stepcache.integrations import _vllm_metadata
    from stepcache.integrations import vllm as plugin

    original = CommonAttentionMetadata.token_to_req_indices
    fresh_loader.load_general_plugins()
    assert set(plugin.status().values()) == {"applied"}
    patched = CommonAttentionMetadata.token_to_req_indices
    assert patched is _vllm_metadata.token_to_req_indices
    fresh_loader.load_general_plugins()  # vLLM's own guard: a no-op
    monkeypatch.setattr(fresh_loader, "plugins_loaded", False)
    fresh_loader.load_general_plugins()  # as another process would: register again
    assert CommonAttentionMetadata.token_to_req_indices is patched
    assert _vllm_metadata._original["token_to_req_indices"] is original
    summaries = [r for r in log.records if "plugin registered" in r.getMessage()]
    assert len(summaries) == 1
    for name in plugin.status():
        assert name in summaries[0].getMessage()
    plugin.unregister()
    assert CommonAttentionMetadata.token_to_req_indices is original


def test_stepcache_vllm_0_leaves_vllm_alone(
    fresh_loader: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from stepcache.integrations import vllm as plugin

    original = CommonAttentionMetadata.token_to_req_indices
    monkeypatch.setenv(plugin.ENV, "0")
    fresh_loader.load_general_plugins()
    assert set(plugin.status().values()) == {"off"}
    assert CommonAttentionMetadata.token_to_req_indices is original


def test_a_target_of_another_shape_is_left_alone(
    fresh_loader: ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vllm.v1.attention.backend import CommonAttentionMetadata

    from stepcache.integrations import vllm as plugin

    def token_to_req_indices(self: object, buffer: object, stream: object) -> None:
        raise AssertionError("not called")

    monkeypatch.setattr(
        CommonAttentionMetadata, "token_to_req_indices", token_to_req_indices
    )
    fresh_loader.load_general_plugins()
    status = plugin.status()
    assert status["vllm.CommonAttentionMetadata.token_to_req_indices"] == (
        "skipped: CommonAttentionMetadata.token_to_req_indices has parameters "
        "(self, buffer, stream), expected (self, buffer)"
    )
    assert CommonAttentionMetadata.token_to_req_indices is token_to_req_indices
    assert status["vllm.split_decodes_and_prefills"] == "applied"
    assert (
        "left vllm.CommonAttentionMetadata.token_to_req_indices unpatched" in log.text
    )
