# SPDX-License-Identifier: Apache-2.0
"""The engine-neutral patch kit, on an engine of its own: a fake module
``fakeengine.attn`` and a small declaration (``STEPCACHE_FAKEENGINE``, one release
series, a scope-wrapped build and a verify-wrapped stand-in). It gets the switch, the
version check, status, counters, verify mode and undo from
:class:`~stepcache.integrations.plugin.EnginePlugin`, with nothing of the vLLM
plugin."""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import stepcache
from stepcache.integrations.patching import (
    REQUIRED,
    InScope,
    Patch,
    Target,
    Verify,
    expect_function,
)
from stepcache.integrations.plugin import EnginePlugin, SwitchError
from stepcache.integrations.vllm.builders import (
    Builders,
    InBuildScope,
    Sharer,
    builders,
)

ENV = "STEPCACHE_FAKEENGINE"
BUILD = "fakeengine.build_metadata"
LENS = "fakeengine.query_lens"


# -- the engine ------------------------------------------------------------------------
class Metadata:
    """One step's layout, as the fake engine's builders get it."""

    def __init__(self, query_start_loc: torch.Tensor) -> None:
        self.query_start_loc = query_start_loc


def query_lens(metadata: Metadata) -> torch.Tensor:
    """The engine's own code: every builder computes it again."""
    engine.stock_calls += 1  # type: ignore[attr-defined]
    return metadata.query_start_loc.diff()


def build_metadata(metadata: Metadata, groups: int) -> list[Any]:
    """The engine's build: one ``query_lens`` per KV-cache group, and the scope each
    ran in."""
    attn = sys.modules["fakeengine.attn"]
    return [
        (attn.query_lens(metadata), stepcache.active_scope()) for _ in range(groups)
    ]


engine = types.ModuleType("fakeengine")
engine.__version__ = "1.2.3"  # type: ignore[attr-defined]
engine.stock_calls = 0  # type: ignore[attr-defined]


@pytest.fixture
def attn(monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """``fakeengine`` and ``fakeengine.attn``, imported; the switch unset."""
    module = types.ModuleType("fakeengine.attn")
    module.query_lens = query_lens  # type: ignore[attr-defined]
    module.build_metadata = build_metadata  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fakeengine", engine)
    monkeypatch.setitem(sys.modules, "fakeengine.attn", module)
    monkeypatch.setattr(engine, "__version__", "1.2.3")
    monkeypatch.setattr(engine, "stock_calls", 0)
    monkeypatch.delenv(ENV, raising=False)
    PLUGIN.unregister()
    PLUGIN.reset_counters()
    yield module
    PLUGIN.unregister()


# -- the plugin: a declaration, nothing more -------------------------------------------
@stepcache.step_cached(depends_on=("query_start_loc",), name=LENS)
def cached_query_lens(metadata: Metadata) -> torch.Tensor:
    return query_lens(metadata)


def find_build(module: types.ModuleType) -> Target:
    params = (("metadata", REQUIRED), ("groups", REQUIRED))
    return Target(
        module, "build_metadata", expect_function(module, "build_metadata", params)
    )


def find_lens(module: types.ModuleType) -> Target:
    original = expect_function(module, "query_lens", (("metadata", REQUIRED),))
    return Target(module, "query_lens", original, cached_query_lens)


PLUGIN = EnginePlugin(
    engine="FakeEngine",
    package="fakeengine",
    env=ENV,
    supported=(("fakeengine", (1, 2)),),
    patches=(
        Patch(BUILD, "fakeengine.attn", find_build, InScope()),
        Patch(LENS, "fakeengine.attn", find_lens, Verify()),
    ),
    logger=logging.getLogger("stepcache.fakeengine"),
    find_installed=lambda: ("fakeengine", sys.modules["fakeengine"].__version__),
)


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=PLUGIN.logger.name)
    return caplog


def step() -> Metadata:
    return Metadata(torch.tensor([0, 2, 5, 6]))


# -- the tests -------------------------------------------------------------------------
def test_off_by_default_nothing_is_patched(
    attn: types.ModuleType, log: pytest.LogCaptureFixture
) -> None:
    PLUGIN.register()
    assert attn.query_lens is query_lens and attn.build_metadata is build_metadata
    assert PLUGIN.status() == {BUILD: "off", LENS: "off"}
    assert PLUGIN.active_mode() == "off"
    assert [r.getMessage() for r in log.records] == [
        "stepcache: STEPCACHE_FAKEENGINE is not set to 1; FakeEngine left unpatched"
    ]


def test_on_opens_the_scope_and_caches_the_stand_in(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "1")
    PLUGIN.register()
    assert PLUGIN.status() == {BUILD: "applied", LENS: "applied"}
    built = attn.build_metadata(step(), groups=3)
    assert [lens.tolist() for lens, _ in built] == [[2, 3, 1]] * 3
    scopes = {id(scope) for _, scope in built}
    assert len(scopes) == 1 and built[0][1] is not None  # one scope for the build
    assert engine.stock_calls == 1  # type: ignore[attr-defined]
    assert PLUGIN.counters() == {BUILD: {"scopes": 1}}


def test_verify_compares_each_call_with_stock_and_names_a_difference(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV, "verify")
    PLUGIN.register()
    assert PLUGIN.active_mode() == "verify" and PLUGIN.verify
    metadata = step()
    attn.build_metadata(metadata, groups=2)
    assert engine.stock_calls == 3  # type: ignore[attr-defined]  # 1 + 2 compared
    assert PLUGIN.counters() == {BUILD: {"scopes": 1}, LENS: {"verified": 2}}
    # a write the version counter does not see: the cache serves the old lengths
    attn.query_lens(metadata)
    metadata.query_start_loc.numpy()[3] = 9
    with pytest.raises(stepcache.StaleCacheError) as caught:
        attn.query_lens(metadata)
    message = str(caught.value)
    assert message.startswith(
        f"stepcache verify: the patch {LENS} gave another value than stock "
        "FakeEngine: tensor 'result' value mismatch at flat index 2. expected 4, "
        "actual 1."
    )
    assert message.endswith(
        "turn the plugin off (STEPCACHE_FAKEENGINE=0) and report this."
    )


def test_an_unknown_switch_value_is_one_warning_naming_the_variable(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "maybe")
    PLUGIN.register()
    PLUGIN.register()
    assert attn.query_lens is query_lens
    assert [r.getMessage() for r in log.records] == [
        "stepcache: STEPCACHE_FAKEENGINE must be 0, 1, verify or force "
        "(got 'maybe'); FakeEngine left unpatched"
    ]
    with pytest.raises(SwitchError, match="STEPCACHE_FAKEENGINE must be 0, 1"):
        PLUGIN.parse_mode("2")


def test_an_untested_version_is_refused_unless_forced(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine, "__version__", "1.3.0")
    monkeypatch.setenv(ENV, "1")
    PLUGIN.register()
    assert attn.query_lens is query_lens
    assert set(PLUGIN.status().values()) == {"off"}
    warnings = [r.getMessage() for r in log.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "stepcache: FakeEngine plugin not applied: fakeengine 1.3.0 is not a version "
        "it was tested against (fakeengine 1.2.x); STEPCACHE_FAKEENGINE=force "
        "applies it anyway"
    ]
    monkeypatch.setenv(ENV, "force")
    PLUGIN.register()
    assert PLUGIN.active_mode() == "force"
    assert set(PLUGIN.status().values()) == {"applied"}


def test_register_twice_is_idempotent_and_unregister_undoes(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(ENV, "1")
    PLUGIN.register()
    patched = attn.query_lens, attn.build_metadata
    PLUGIN.register()
    assert (attn.query_lens, attn.build_metadata) == patched
    assert patched[0] is not query_lens and patched[1] is not build_metadata
    summaries = [r for r in log.records if "plugin registered" in r.getMessage()]
    assert len(summaries) == 1
    assert "STEPCACHE_FAKEENGINE=on, fakeengine 1.2.3" in summaries[0].getMessage()
    PLUGIN.unregister()
    assert attn.query_lens is query_lens and attn.build_metadata is build_metadata
    assert PLUGIN.status() == {BUILD: "off", LENS: "off"}
    PLUGIN.register()  # and again, as a process that switches it back on
    assert PLUGIN.status() == {BUILD: "applied", LENS: "applied"}


def test_a_module_not_imported_yet_is_waited_for(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "fakeengine.attn")
    monkeypatch.setenv(ENV, "1")
    PLUGIN.register()
    assert PLUGIN.status() == {
        BUILD: "waiting for fakeengine.attn",
        LENS: "waiting for fakeengine.attn",
    }


def test_its_counters_are_its_own(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another plugin of the process (the vLLM plugin's counters) is not reported."""
    from stepcache.integrations.patching import counters

    counters.count("vllm.some_patch", "scopes")
    monkeypatch.setenv(ENV, "1")
    PLUGIN.register()
    attn.build_metadata(step(), groups=1)
    assert PLUGIN.counters() == {BUILD: {"scopes": 1}}
    PLUGIN.reset_counters()
    assert counters.to_dict()["vllm.some_patch"] == {"scopes": 1}
    counters.reset(["vllm.some_patch"])


# -- vLLM's gate (its builders), declared on this engine --------------------------------
# (stepcache.integrations.vllm.builders imports nothing of vLLM)
class Builder:
    """A metadata builder of the engine whose builds call the cached function."""

    def __init__(self, groups: int) -> None:
        self.groups = groups


def test_scopes_apply_once_a_builder_that_needs_them_is_made(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    attn.Builder = Builder  # type: ignore[attr-defined]
    init = Builder.__init__
    lazy = dataclasses.replace(PLUGIN, gate=builders(("fakeengine.attn", "Builder")))
    monkeypatch.setenv(ENV, "1")
    lazy.register()
    try:
        # no builder made: the build is the engine's own, unwrapped and unscoped
        assert lazy.status()[BUILD] == "waiting for a builder that needs scopes"
        assert lazy.status()[LENS] == "applied"
        assert attn.build_metadata is build_metadata
        assert all(s is None for _, s in attn.build_metadata(step(), 2))
        Builder(2)  # the engine makes a builder whose builds call the cache
        assert lazy.status()[BUILD] == "applied"
        assert Builder.__init__ is init  # watched no longer
        assert attn.build_metadata is not build_metadata
        assert all(s is not None for _, s in attn.build_metadata(step(), 2))
        assert lazy.counters()[BUILD] == {"scopes": 1}
        # the engine's builders are made once: switched off and on, it keeps them
        lazy.unregister()
        lazy.register()
        assert lazy.status()[BUILD] == "applied"
    finally:
        lazy.unregister()
    assert attn.build_metadata is build_metadata


# -- scopes in builds of decodes only ---------------------------------------------------
class Decoder:
    """A metadata builder whose builds share values in decodes too."""


def build_step(metadata: Metadata, groups: int, longest: Any) -> list[Any]:
    """A build that names its longest query (``max_query_len`` in vLLM)."""
    return build_metadata(metadata, groups)


def find_step(module: types.ModuleType) -> Target:
    params = (("metadata", REQUIRED), ("groups", REQUIRED), ("longest", REQUIRED))
    return Target(module, "build_step", expect_function(module, "build_step", params))


STEP = "fakeengine.build_step"


def scopes(built: list[Any]) -> list[bool]:
    return [s is not None for _, s in built]


def test_builds_of_decodes_open_no_scope_until_a_builder_shares_there(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    from stepcache.integrations.patching import counters

    attn.Builder, attn.Decoder = Builder, Decoder  # type: ignore[attr-defined]
    attn.build_step = build_step  # type: ignore[attr-defined]
    inits = Builder.__init__, Decoder.__init__
    lazy = dataclasses.replace(
        PLUGIN,
        patches=(
            Patch(STEP, "fakeengine.attn", find_step, InBuildScope(longest="longest")),
        )
        + PLUGIN.patches[1:],
        gate=builders(
            Sharer("fakeengine.attn", "Builder", decode=False),
            ("fakeengine.attn", "Decoder"),
        ),
    )
    monkeypatch.setenv(ENV, "1")
    lazy.register()
    try:
        assert lazy.status()[STEP] == "waiting for a builder that needs scopes"
        Builder(2)  # it calls the cache for prefill rows only
        assert lazy.status()[STEP] == "applied"
        assert scopes(attn.build_step(step(), 2, 1)) == [False, False]  # decodes
        assert lazy.counters()[STEP] == {"unscoped": 1}
        # a prefill: one scope, the groups share
        engine.stock_calls = 0  # type: ignore[attr-defined]
        assert scopes(attn.build_step(step(), 2, 3)) == [True, True]
        assert engine.stock_calls == 1  # type: ignore[attr-defined]
        # anything but an int of at most 1 opens it (sharing is only saved work)
        assert scopes(attn.build_step(step(), 2, None)) == [True, True]
        assert scopes(attn.build_step(step(), 2, longest=0)) == [False, False]
        assert lazy.counters()[STEP] == {"unscoped": 2, "scopes": 2}
        # a builder that shares in decodes: every build opens one, for good
        Decoder()
        assert (Builder.__init__, Decoder.__init__) == inits  # watched no longer
        assert scopes(attn.build_step(step(), 2, 1)) == [True, True]
        lazy.unregister()
        lazy.register()
        assert scopes(attn.build_step(step(), 2, 1)) == [True, True]
    finally:
        lazy.unregister()
        counters.reset([STEP])
    assert attn.build_step is build_step


def test_a_builder_that_shares_in_decodes_made_first_opens_every_builds_scope(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    attn.Builder, attn.Decoder = Builder, Decoder  # type: ignore[attr-defined]
    attn.build_step = build_step  # type: ignore[attr-defined]
    lazy = dataclasses.replace(
        PLUGIN,
        patches=(
            Patch(STEP, "fakeengine.attn", find_step, InBuildScope(longest="longest")),
        ),
        gate=builders(
            Sharer("fakeengine.attn", "Builder", decode=False),
            Sharer("fakeengine.attn", "Decoder"),
        ),
    )
    monkeypatch.setenv(ENV, "1")
    lazy.register()
    try:
        Decoder()
        Builder(1)  # changes nothing: the scopes open in every build already
        assert scopes(attn.build_step(step(), 1, 1)) == [True]
    finally:
        lazy.unregister()


# -- patches left out --------------------------------------------------------------------
SKIP = "STEPCACHE_FAKEENGINE_SKIP"


def skipping(monkeypatch: pytest.MonkeyPatch, names: str) -> EnginePlugin:
    """The declaration with ``skip_env``, switched on, ``names`` left out."""
    import dataclasses

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setenv(SKIP, names)
    return dataclasses.replace(PLUGIN, skip_env=SKIP)


def registered_again_it_caches(plugin: EnginePlugin, attn: types.ModuleType) -> None:
    """Registered again (the environment read anew): the stand-in applies, and a
    build of three groups computes once."""
    plugin.unregister()
    plugin.register()
    assert plugin.status()[LENS] == "applied"
    engine.stock_calls = 0  # type: ignore[attr-defined]
    attn.build_metadata(step(), groups=3)
    assert engine.stock_calls == 1  # type: ignore[attr-defined]


def test_a_patch_left_out_is_not_applied_and_says_so(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = skipping(monkeypatch, f" {LENS} ,")
    plugin.register()
    try:
        summary = [m for m in log.messages if "plugin registered" in m]
        assert len(summary) == 1
        assert summary[0].endswith(
            f"patched: {BUILD}; waiting for the import of: nothing; "
            f"left out ({SKIP}): {LENS}"
        )
        assert plugin.status() == {
            BUILD: "applied",
            LENS: f"skipped: left out by {SKIP}",
        }
        assert attn.query_lens is query_lens  # the engine's own
        built = attn.build_metadata(step(), groups=3)
        assert all(s is not None for _, s in built)  # the scope still opens
        assert engine.stock_calls == 3  # type: ignore[attr-defined]
        # read at each registration
        monkeypatch.delenv(SKIP)
        registered_again_it_caches(plugin, attn)
    finally:
        plugin.unregister()
    assert attn.query_lens is query_lens


def test_a_name_that_is_no_patch_is_one_warning_and_nothing_applied(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = skipping(monkeypatch, f"{LENS},fakeengine.query_len")
    plugin.register()
    plugin.register()
    assert plugin.active_mode() == "off"
    assert attn.query_lens is query_lens and attn.build_metadata is build_metadata
    assert [r.getMessage() for r in log.records] == [
        f"stepcache: {SKIP} names no patch of the FakeEngine plugin: "
        f"'fakeengine.query_len' (its patches: {BUILD}, {LENS}); FakeEngine left "
        "unpatched"
    ]
    with pytest.raises(SwitchError, match="names no patch"):
        plugin.parse_skip("nothing.of.it")
    assert plugin.parse_skip(None) == plugin.parse_skip(" , ") == frozenset()


@pytest.mark.parametrize("left_out", ["", "skipped", "off by default"])
def test_a_builder_that_shares_in_decodes_through_a_patch_left_out_does_not(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch, left_out: str
) -> None:
    import dataclasses

    attn.Decoder = Decoder  # type: ignore[attr-defined]
    attn.build_step = build_step  # type: ignore[attr-defined]
    lens = PLUGIN.patches[1]
    plugin = dataclasses.replace(
        PLUGIN,
        patches=(
            Patch(STEP, "fakeengine.attn", find_step, InBuildScope(longest="longest")),
            dataclasses.replace(lens, opt_in=left_out == "off by default"),
        ),
        gate=builders(
            Sharer("fakeengine.attn", "Decoder", decode=(LENS,)),
        ),
        skip_env=SKIP,
        add_env=ADD,
    )
    monkeypatch.setenv(ENV, "1")
    if left_out == "skipped":
        monkeypatch.setenv(SKIP, LENS)
    plugin.register()
    try:
        Decoder()
        # decodes: a scope only where the patch its decodes call applies
        assert scopes(attn.build_step(step(), 2, 1)) == [not left_out] * 2
        assert scopes(attn.build_step(step(), 2, 3)) == [True, True]  # a prefill
    finally:
        plugin.unregister()


# -- patches off by default ----------------------------------------------------------
ADD = "STEPCACHE_FAKEENGINE_ADD"


def opting_in(monkeypatch: pytest.MonkeyPatch) -> EnginePlugin:
    """The declaration with the stand-in off by default, switched on."""
    import dataclasses

    monkeypatch.setenv(ENV, "1")
    build, lens = PLUGIN.patches
    return dataclasses.replace(
        PLUGIN,
        patches=(build, dataclasses.replace(lens, opt_in=True)),
        skip_env=SKIP,
        add_env=ADD,
    )


def test_a_patch_off_by_default_applies_only_where_added(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = opting_in(monkeypatch)
    plugin.register()
    try:
        summary = [m for m in log.messages if "plugin registered" in m]
        assert summary[0].endswith(f"; off by default ({ADD} applies): {LENS}")
        assert plugin.status() == {
            BUILD: "applied",
            LENS: f"skipped: off by default ({ADD}={LENS} applies it)",
        }
        assert attn.query_lens is query_lens  # the engine's own
        attn.build_metadata(step(), groups=3)
        assert engine.stock_calls == 3  # type: ignore[attr-defined]
        # read at each registration: added, it applies and caches
        monkeypatch.setenv(ADD, f" {LENS} ")
        registered_again_it_caches(plugin, attn)
        # a patch applied by default may be named too: it applies
        monkeypatch.setenv(ADD, f"{LENS},{BUILD}")
        plugin.unregister()
        plugin.register()
        assert set(plugin.status().values()) == {"applied"}
    finally:
        plugin.unregister()
    assert attn.query_lens is query_lens


def test_all_adds_every_patch_off_by_default_but_a_skipped_one(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = opting_in(monkeypatch)
    assert plugin.parse_add(" all ") == {LENS}
    assert plugin.parse_add(f"all,{BUILD}") == {LENS, BUILD}
    monkeypatch.setenv(ADD, "all")
    plugin.register()
    try:
        assert set(plugin.status().values()) == {"applied"}
        registered_again_it_caches(plugin, attn)
        # a patch it leaves out stays out: all names no patch of its own
        monkeypatch.setenv(SKIP, LENS)
        plugin.unregister()
        plugin.register()
        assert plugin.active_mode() == "on"
        assert plugin.status()[LENS].startswith("skipped")
        assert attn.query_lens is query_lens
    finally:
        plugin.unregister()


def test_no_patch_may_be_named_all() -> None:
    import dataclasses

    build, lens = PLUGIN.patches
    with pytest.raises(TypeError, match="no patch may be named 'all'"):
        dataclasses.replace(
            PLUGIN, patches=(build, dataclasses.replace(lens, name="all"))
        )


@pytest.mark.parametrize(
    ("skip", "add", "message"),
    [
        ("", "fakeengine.query_len", f"{ADD} names no patch of the FakeEngine plugin"),
        (LENS, LENS, f"{SKIP} and {ADD} both name '{LENS}': leave it out or add it"),
    ],
)
def test_an_add_that_names_no_patch_or_a_skipped_one_is_one_warning(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    skip: str,
    add: str,
    message: str,
) -> None:
    plugin = opting_in(monkeypatch)
    monkeypatch.setenv(SKIP, skip)
    monkeypatch.setenv(ADD, add)
    plugin.register()
    plugin.register()
    assert plugin.active_mode() == "off"
    assert attn.query_lens is query_lens and attn.build_metadata is build_metadata
    (line,) = [r.getMessage() for r in log.records]
    assert line.startswith(f"stepcache: {message}")
    assert line.endswith("; FakeEngine left unpatched")


def test_a_patch_off_by_default_needs_a_variable_that_adds_it() -> None:
    import dataclasses

    build, lens = PLUGIN.patches
    with pytest.raises(TypeError, match=f"off by default \\({LENS}\\) but no add_env"):
        dataclasses.replace(
            PLUGIN, patches=(build, dataclasses.replace(lens, opt_in=True))
        )


# -- patches a builder shares ------------------------------------------------------------
def sharing(monkeypatch: pytest.MonkeyPatch, attn: types.ModuleType) -> EnginePlugin:
    """The declaration whose stand-in only ``Builder``'s builds share; ``Decoder``
    needs scopes for patches of its own. Switched on, ``SKIP`` may leave out."""
    import dataclasses

    attn.Builder, attn.Decoder = Builder, Decoder  # type: ignore[attr-defined]
    monkeypatch.setenv(ENV, "1")
    return dataclasses.replace(
        PLUGIN,
        gate=builders(
            Sharer("fakeengine.attn", "Builder", shares=(LENS,)),
            Sharer("fakeengine.attn", "Decoder"),
        ),
        skip_env=SKIP,
    )


def test_a_patch_a_builder_shares_applies_once_that_builder_is_made(
    attn: types.ModuleType,
    log: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin = sharing(monkeypatch, attn)
    plugin.register()
    try:
        assert plugin.status() == {
            BUILD: "waiting for a builder that needs scopes",
            LENS: "waiting for a builder that shares it",
        }
        Decoder()  # scopes, but not the stand-in: its builds do not share it
        assert plugin.status()[BUILD] == "applied"
        assert plugin.status()[LENS] == "waiting for a builder that shares it"
        assert attn.query_lens is query_lens
        engine.stock_calls = 0  # type: ignore[attr-defined]
        attn.build_metadata(step(), groups=3)
        assert engine.stock_calls == 3  # type: ignore[attr-defined]
        Builder(3)
        assert plugin.status()[LENS] == "applied"
        assert f"{LENS} apply" in log.text
        engine.stock_calls = 0  # type: ignore[attr-defined]
        attn.build_metadata(step(), groups=3)
        assert engine.stock_calls == 1  # type: ignore[attr-defined]
        # the engine's builders are made once: switched off and on, it keeps them
        registered_again_it_caches(plugin, attn)
    finally:
        plugin.unregister()
    assert attn.query_lens is query_lens


def test_a_builder_whose_shared_patches_are_left_out_opens_no_scope(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = sharing(monkeypatch, attn)
    monkeypatch.setenv(SKIP, LENS)
    plugin.register()
    try:
        Builder(3)
        assert plugin.status() == {
            BUILD: "waiting for a builder that needs scopes",
            LENS: f"skipped: left out by {SKIP}",
        }
        assert attn.build_metadata is build_metadata
        Decoder()  # a builder that shares other patches still opens scopes
        assert plugin.status()[BUILD] == "applied"
        assert attn.query_lens is query_lens
    finally:
        plugin.unregister()


@pytest.mark.parametrize("imported", [True, False])
def test_a_caller_that_drives_the_builds_itself_applies_every_shared_patch(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch, imported: bool
) -> None:
    """Each applies once its module is imported: one not imported yet says it waits
    for that module, not for a builder."""
    plugin = sharing(monkeypatch, attn)
    if not imported:
        monkeypatch.delitem(sys.modules, "fakeengine.attn")
    plugin.register()
    try:
        gate = plugin.the_gate
        assert isinstance(gate, Builders)
        gate.want_scopes()
        if imported:
            assert set(plugin.status().values()) == {"applied"}
        else:
            assert plugin.status()[LENS] == "waiting for fakeengine.attn"
    finally:
        plugin.unregister()


def test_plugin_functions_call_the_declaration_the_module_holds_now(
    attn: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepcache.integrations.plugin import PluginFunctions

    module = types.ModuleType("fakeengine_plugin")
    module.PLUGIN = PLUGIN  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fakeengine_plugin", module)
    functions = PluginFunctions("fakeengine_plugin")
    monkeypatch.setenv(ENV, "1")
    functions.register()
    assert functions.status() == {BUILD: "applied", LENS: "applied"}
    assert functions.active_mode() == "on"
    functions.unregister()
    assert functions.status() == {BUILD: "off", LENS: "off"}
    module.PLUGIN = "not a plugin"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="fakeengine_plugin.PLUGIN is a str"):
        functions.register()
