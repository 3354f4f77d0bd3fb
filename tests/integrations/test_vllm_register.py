# SPDX-License-Identifier: Apache-2.0
"""The plugin's registration machinery, on stand-in patches (no vLLM needed):
idempotent, switchable by STEPCACHE_VLLM, silent without vLLM, never raising into
vLLM, logging what it applied."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from types import ModuleType

import pytest

from stepcache.integrations import vllm as plugin
from stepcache.integrations._vllm_patch import Patch, SkipPatch, Undo


class Target:
    """Records what was applied and undone to one stand-in module."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applied = 0
        self.undone = 0

    def apply(self, module: ModuleType) -> Undo:
        assert module.__name__ == self.name
        self.applied += 1
        module.patched = True  # type: ignore[attr-defined]

        def undo() -> None:
            self.undone += 1
            module.patched = False  # type: ignore[attr-defined]

        return undo


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    # vLLM's logging setup stops "vllm.*" records at its own logger: listen on ours.
    logger = plugin.logger
    old = logger.level, logger.propagate
    logger.addHandler(caplog.handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.level, logger.propagate = old


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Target]]:
    """Two stand-in modules, imported already, with one patch each; vLLM 'installed'."""
    plugin.unregister()
    targets = {}
    for name in ("sc_fake_vllm_a", "sc_fake_vllm_b"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        targets[name] = Target(name)
    monkeypatch.setattr(
        plugin,
        "PATCHES",
        tuple(Patch(f"patch {n}", n, t.apply) for n, t in targets.items()),
    )
    monkeypatch.setattr(plugin, "_vllm_version", lambda: "0.0-test")
    monkeypatch.delenv(plugin.ENV, raising=False)
    yield targets
    plugin.unregister()


def test_register_is_idempotent_and_logs_once(
    fake: dict[str, Target], log: pytest.LogCaptureFixture
) -> None:
    plugin.register()
    plugin.register()
    assert [t.applied for t in fake.values()] == [1, 1]
    assert all(sys.modules[n].patched for n in fake)  # type: ignore[attr-defined]
    summaries = [r for r in log.records if "plugin registered" in r.getMessage()]
    assert len(summaries) == 1
    assert "patched: patch sc_fake_vllm_a, patch sc_fake_vllm_b" in summaries[0].message
    assert set(plugin.status().values()) == {"applied"}


def test_unregister_undoes_and_allows_a_new_registration(
    fake: dict[str, Target],
) -> None:
    plugin.register()
    plugin.unregister()
    assert [t.undone for t in fake.values()] == [1, 1]
    assert set(plugin.status().values()) == {"off"}
    plugin.register()
    assert [t.applied for t in fake.values()] == [2, 2]


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_stepcache_vllm_0_applies_nothing(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
) -> None:
    monkeypatch.setenv(plugin.ENV, value)
    plugin.register()
    assert [t.applied for t in fake.values()] == [0, 0]
    assert set(plugin.status().values()) == {"off"}
    assert "STEPCACHE_VLLM=0" in log.text


def test_a_malformed_switch_leaves_vllm_alone_and_says_so(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(plugin.ENV, "maybe")
    plugin.register()
    assert [t.applied for t in fake.values()] == [0, 0]
    assert "must be 0 or 1 (got 'maybe')" in log.text


def test_without_vllm_register_does_nothing(
    fake: dict[str, Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # the real _vllm_version again, and no stand-in modules
    plugin.unregister()
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    plugin.register()
    assert set(plugin.status().values()) == {"off"}


def test_a_target_of_another_shape_is_skipped_and_logged(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(module: ModuleType) -> Undo:
        raise SkipPatch("sc_fake_vllm_a.f has parameters (x), expected (x, y)")

    def crash(module: ModuleType) -> Undo:
        raise RuntimeError("bug in a patch")

    good = fake["sc_fake_vllm_b"]
    monkeypatch.setattr(
        plugin,
        "PATCHES",
        (
            Patch("refused", "sc_fake_vllm_a", refuse),
            Patch("crashing", "sc_fake_vllm_a", crash),
            Patch("good", "sc_fake_vllm_b", good.apply),
        ),
    )
    plugin.register()  # raises nothing into vLLM
    status = plugin.status()
    assert status["refused"] == (
        "skipped: sc_fake_vllm_a.f has parameters (x), expected (x, y)"
    )
    assert status["crashing"] == "skipped: RuntimeError: bug in a patch"
    assert status["good"] == "applied"
    assert "left refused unpatched" in log.text
    assert "could not apply crashing" in log.text


def test_a_module_imported_later_is_patched_on_import(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    late = Target("sc_fake_vllm_late")
    monkeypatch.setattr(
        plugin, "PATCHES", (Patch("late patch", "sc_fake_vllm_late", late.apply),)
    )
    plugin.register()
    assert plugin.status() == {"late patch": "waiting for sc_fake_vllm_late"}
    assert late.applied == 0
    # a module appears through the import system: give it a finder
    module = types.ModuleType("sc_fake_vllm_late")

    class Loader:
        def create_module(self, spec: object) -> ModuleType:
            return module

        def exec_module(self, module: ModuleType) -> None:
            module.f = 1  # type: ignore[attr-defined]

    class Finder:
        def find_spec(self, name: str, path: object, target: object = None) -> object:
            import importlib.util

            if name != "sc_fake_vllm_late":
                return None
            return importlib.util.spec_from_loader(name, Loader())

    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    monkeypatch.delitem(sys.modules, "sc_fake_vllm_late", raising=False)
    import sc_fake_vllm_late  # type: ignore[import-not-found]  # noqa: F401

    assert late.applied == 1
    assert plugin.status() == {"late patch": "applied"}
    assert "stepcache: patched late patch" in log.text
