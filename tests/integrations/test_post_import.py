# SPDX-License-Identifier: Apache-2.0
"""Hooks run on a module right after it is imported (or at once if it already is)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from stepcache.integrations import patching as post_import


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh package ``sc_hooktest_<n>`` with a module ``target`` defining ``f`` and
    a module ``user`` that does ``from .target import f``."""
    name = f"sc_hooktest_{tmp_path.name}".replace("-", "_")
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("def f():\n    return 'original'\n")
    (pkg / "user.py").write_text("from .target import f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield name
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


def test_a_hook_runs_after_the_import_and_before_importers_bind(package: str) -> None:
    seen: list[str] = []

    def patch(module: ModuleType) -> None:
        seen.append(module.__name__)
        module.f = lambda: "patched"  # type: ignore[attr-defined]

    post_import.when_imported(f"{package}.target", patch)
    assert seen == []
    assert f"{package}.target" in post_import.pending()
    user = importlib.import_module(f"{package}.user")
    assert seen == [f"{package}.target"]
    assert user.f() == "patched"  # the importer bound the patched function
    assert f"{package}.target" not in post_import.pending()
    # the module's loader keeps its class
    loader = sys.modules[f"{package}.target"].__spec__.loader  # type: ignore[union-attr]
    assert type(loader).__name__ == "SourceFileLoader"


def test_an_imported_module_is_hooked_at_once(package: str) -> None:
    module = importlib.import_module(f"{package}.target")
    seen: list[ModuleType] = []
    post_import.when_imported(f"{package}.target", seen.append)
    assert seen == [module]


def test_a_cancelled_hook_never_runs(package: str) -> None:
    seen: list[ModuleType] = []
    cancel = post_import.when_imported(f"{package}.target", seen.append)
    cancel()
    importlib.import_module(f"{package}.target")
    assert seen == []
    assert post_import.pending() == []
    assert all(type(f).__name__ != "_Finder" for f in sys.meta_path)


def test_hooks_run_once_each_in_order(package: str) -> None:
    seen: list[str] = []
    post_import.when_imported(f"{package}.target", lambda m: seen.append("a"))
    post_import.when_imported(f"{package}.target", lambda m: seen.append("b"))
    importlib.import_module(f"{package}.target")
    importlib.import_module(f"{package}.user")
    assert seen == ["a", "b"]
