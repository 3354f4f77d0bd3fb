# SPDX-License-Identifier: Apache-2.0
"""The ``pytest11`` entry point of stepcache's pytest plugin: options, marker, fixture.

pytest imports the module of every ``pytest11`` entry point at start-up, in every
project of an environment where stepcache is installed. This module therefore
imports neither stepcache nor torch: it declares ``--stepcache-debug``,
``--stepcache-stats``, the ``stepcache_debug`` marker and fixture, and registers the
plugin itself (:mod:`stepcache.pytest_plugin`) only when a session asks for it: one of
the options, or a collected test with the marker or the fixture. A session that asks
for none pays nothing. ``-p no:stepcache`` disables both.

It lives outside the ``stepcache`` package because importing anything in that package
runs ``stepcache/__init__.py``, which imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pytest

if TYPE_CHECKING:
    from stepcache.pytest_plugin import DebugHandle

MODES: Final = ("off", "checks", "verify")
OPTION: Final = "--stepcache-debug"
MARKER: Final = "stepcache_debug"
_NAME: Final = "stepcache-plugin"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("stepcache", "stepcache (per-step caches)")
    group.addoption(
        OPTION,
        nargs="?",
        const="checks",
        default=None,
        metavar="MODE",
        dest="stepcache_debug",
        help="run every test in stepcache debug mode: checks (the default) or verify "
        "(also recompute every hit); a detection fails its test",
    )
    group.addoption(
        "--stepcache-stats",
        action="store_true",
        default=False,
        dest="stepcache_stats",
        help="print stepcache's per-function hit/miss table at the end of the session",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """Let ``--stepcache-debug`` stand before a path: ``--stepcache-debug tests/``
    means checks mode on ``tests/``, not mode ``tests/``."""
    changed = False
    for i, arg in enumerate(args[:-1]):
        if arg == OPTION and args[i + 1] not in MODES:
            args[i] = f"{OPTION}=checks"
            changed = True
    if changed:
        early_config.known_args_namespace = parser.parse_known_args(
            args, namespace=early_config.known_args_namespace
        )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(mode='checks'): run this test in stepcache debug mode "
        "(checks, verify; off exempts it from --stepcache-debug); a detection fails it",
    )
    mode = config.getoption("stepcache_debug", None)
    if mode is not None and mode not in MODES[1:]:
        raise pytest.UsageError(
            f"{OPTION} takes checks or verify (got {mode!r}); write "
            f"{OPTION}=verify, or {OPTION} alone for checks"
        )
    if mode is not None or config.getoption("stepcache_stats", False):
        _register(config)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if any(_wants(item) for item in items):
        _register(config)


def _wants(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None or MARKER in getattr(
        item, "fixturenames", ()
    )


def _register(config: pytest.Config) -> None:
    """Register the plugin, once (its ``pytest_configure`` runs on registration)."""
    if config.pluginmanager.get_plugin(_NAME) is None:
        from stepcache import pytest_plugin

        config.pluginmanager.register(pytest_plugin, _NAME)


@pytest.fixture
def stepcache_debug(request: pytest.FixtureRequest) -> DebugHandle:
    """Run this test in stepcache debug mode (``checks``, or the marker's mode) and
    get a handle on its detections; ``take()`` accepts them."""
    from stepcache import pytest_plugin

    return pytest_plugin.debug_handle(request)
