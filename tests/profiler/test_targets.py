# SPDX-License-Identifier: Apache-2.0
"""Which functions a target names, and the typed errors for targets that name none."""

from __future__ import annotations

import functools
import pathlib
import re
import sys
import types

import pytest

import stepcache
from stepcache.profiler import (
    ProfilerError,
    TargetError,
    TargetNotCallableError,
    TargetNotFoundError,
)
from stepcache.profiler._targets import add_aliases, resolve, resolve_all

from . import sample

MOD = sample.__name__  # "tests.profiler.sample", or "profiler.sample" under pytest


def names(spec: object) -> set[str]:
    return {t.name.partition(":")[2] for t in resolve(spec)}


METHODS = {
    "Builder.build",
    "Builder.index",
    "Builder.layer",
    "Builder.helper",
    "Builder.make",
}
FUNCTIONS = {"make_step", "total", "scaled", "noisy", "run"}


def test_a_module_is_its_functions_and_methods() -> None:
    # Not: dunders (__init__, __repr__), the property, the imported sqrt, constants,
    # the dataclass's generated methods.
    assert names(MOD) == FUNCTIONS | METHODS
    assert names(sample) == FUNCTIONS | METHODS


def test_a_class_is_its_own_methods() -> None:
    assert names(f"{MOD}:Builder") == METHODS
    assert names(sample.Builder) == METHODS
    kinds = {t.name.rpartition(".")[2]: t.kind for t in resolve(sample.Builder)}
    assert kinds["helper"] == "staticmethod" and kinds["make"] == "classmethod"
    assert kinds["build"] == "method"


def test_single_functions_and_methods() -> None:
    assert names(f"{MOD}:total") == {"total"}
    assert names(f"{MOD}:Builder.build") == {"Builder.build"}
    assert names(sample.total) == {"total"}
    assert names(sample.Builder.build) == {"Builder.build"}
    assert names(sample.Builder().build) == {"Builder.build"}  # a bound method


def test_wildcards() -> None:
    assert names(f"{MOD}:*.build") == {"Builder.build"}
    assert names(f"{MOD}:Builder.*") == METHODS
    assert names(f"{MOD}:s*") == {"scaled"}
    with pytest.raises(TargetNotFoundError, match="matches no function"):
        resolve(f"{MOD}:Builder.si*")  # only the property


def test_each_target_once() -> None:
    targets = resolve_all([MOD, f"{MOD}:total", sample.total, f"{MOD}:Builder"])
    assert len(targets) == len(FUNCTIONS | METHODS)


def test_aliases_are_found() -> None:
    alias = types.ModuleType("alias_of_sample")
    alias.renamed = sample.total  # type: ignore[attr-defined]
    sys.modules[alias.__name__] = alias
    try:
        (target,) = resolve(f"{MOD}:total")
        add_aliases([target])
        assert [(s.container, s.attr) for s in target.sites] == [
            (sample, "total"),
            (alias, "renamed"),
        ]
    finally:
        del sys.modules[alias.__name__]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz", "no module named 'no_such_module_xyz'"),
        (f"{MOD}.total", "an attribute of a module is written"),
        (f"{MOD}:totl", "did you mean 'total'"),
        (f"{MOD}:Builder.biuld", "did you mean 'build'"),
        (f"{MOD}:Nothing.build", "has no attribute matching 'Nothing'"),
        (f"{MOD}:zz*", "has no attribute matching 'zz*'"),
        (f"{MOD}:", "expected 'package.module' or 'package.module:attr'"),
    ],
)
def test_not_found(spec: str, message: str) -> None:
    with pytest.raises(TargetNotFoundError, match=re.escape(message)) as info:
        resolve(spec)
    assert isinstance(info.value, LookupError)
    assert isinstance(info.value, stepcache.StepCacheError)
    assert repr(spec) in str(info.value)


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        (f"{MOD}:CONSTANT", "a int"),
        (f"{MOD}:Builder.size", "a property"),
        (42, "a int"),
    ],
)
def test_not_callable(spec: object, what: str) -> None:
    with pytest.raises(TargetNotCallableError, match=what) as info:
        resolve(spec)
    assert isinstance(info.value, TypeError)


def test_no_home() -> None:
    def local() -> None: ...

    with pytest.raises(TargetError, match="no home"):
        resolve(local)
    with pytest.raises(TargetError, match="callable object"):
        resolve(functools.partial(sample.total))


def test_a_module_that_fails_to_import_is_not_hidden(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_target_mod.py").write_text("import no_such_dependency_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_dependency_xyz"):
        resolve("broken_target_mod")


def test_profile_raises_the_same_errors_and_wraps_nothing() -> None:
    before = sample.total
    with (
        pytest.raises(TargetNotFoundError),
        stepcache.profile([f"{MOD}:total", "nope_xyz"]),
    ):
        pass  # pragma: no cover
    assert sample.total is before
    with pytest.raises(TargetError, match="at least one target"):
        stepcache.profile([])
    with (
        pytest.raises(TargetError, match="names 5 functions"),
        stepcache.profile(f"{MOD}:total", step=f"{MOD}:Builder"),
    ):
        pass  # pragma: no cover
    assert sample.total is before
    assert issubclass(TargetError, ProfilerError)
