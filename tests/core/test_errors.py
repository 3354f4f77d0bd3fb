# SPDX-License-Identifier: Apache-2.0
"""Errors: a raising builder caches nothing; bad keys are typed errors naming the function."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import stepcache
from stepcache import StepCacheError, step_cached


class Meta:
    def __init__(self) -> None:
        self.fail = True
        self.calls = 0

    @step_cached()
    def flaky(self) -> int:
        self.calls += 1
        if self.fail:
            raise RuntimeError("builder broke")
        return 42

    @step_cached(key=lambda self, k: k)
    def keyed(self, k: Any) -> int:
        return 1

    @step_cached(key=lambda self, k: 1 // k)
    def key_raises(self, k: int) -> int:
        return 1

    @step_cached(depends_on=("missing",))
    def needs_missing(self) -> int:
        return 1


def test_a_builder_that_raises_caches_nothing() -> None:
    m = Meta()
    with pytest.raises(RuntimeError, match="builder broke"):
        m.flaky()
    assert len(stepcache.cache_of(m)) == 0
    m.fail = False
    assert m.flaky() == 42
    assert m.flaky() == 42
    assert m.calls == 2


def test_unhashable_key_names_the_function() -> None:
    with pytest.raises(StepCacheError, match=r"Meta\.keyed.*unhashable") as info:
        Meta().keyed([1, 2])
    assert "tuple" in str(info.value)
    assert not isinstance(info.value, TypeError)


def test_key_function_that_raises_names_the_function() -> None:
    with pytest.raises(
        StepCacheError, match=r"Meta\.key_raises.*ZeroDivisionError"
    ) as info:
        Meta().key_raises(0)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert Meta().key_raises(1) == 1


def test_missing_dependency_attribute_is_a_typed_error() -> None:
    with pytest.raises(StepCacheError, match=r"needs_missing.*depends_on.*missing"):
        Meta().needs_missing()


def test_errors_form_one_hierarchy() -> None:
    assert issubclass(stepcache.CacheValidationError, StepCacheError)
    assert issubclass(stepcache.CacheValidationError, AssertionError)
    assert issubclass(stepcache.StaleCacheError, StepCacheError)


def test_attach_refuses_non_caches() -> None:
    with pytest.raises(StepCacheError, match="needs a StepCache"):
        stepcache.attach(Meta(), {})  # type: ignore[arg-type]


def test_an_owner_of_none_is_a_typed_error() -> None:
    @step_cached(name="errors.none_owner")
    def index(md: Any) -> int:
        return 1

    with pytest.raises(StepCacheError, match="the owner is None"):
        index(None)
    with pytest.raises(StepCacheError, match="the owner is None"):
        stepcache.cache_of(None)


@pytest.mark.parametrize(
    ("attr", "value"),
    [("n", None), ("n", torch.tensor(2)), ("device", "bogus")],
    ids=["missing attribute", "0-dim tensor as a size", "malformed device"],
)
def test_an_expect_reference_that_cannot_be_resolved_is_a_typed_error(
    attr: str, value: Any
) -> None:
    spec = stepcache.TensorSpec(shape=(stepcache.Attr("n"),))
    if attr == "device":
        spec = stepcache.TensorSpec(device=stepcache.Attr("device"))

    class Owner:
        @step_cached(expect=spec, name="errors.ref")
        def rows(self) -> torch.Tensor:
            return torch.zeros(2)

    md = Owner()
    if value is not None:
        setattr(md, attr, value)
    with pytest.raises(
        stepcache.CacheValidationError, match=f"expect's Attr\\('{attr}'\\)"
    ):
        md.rows()


def test_an_only_test_that_raises_is_named_as_such_beside_a_key_function() -> None:
    @step_cached(key=lambda md, kind: kind, only={"kind": frozenset({"a"})})
    def rows(md: Any, kind: Any) -> int:
        return 1

    with pytest.raises(StepCacheError, match="its only= test raised TypeError"):
        rows(Meta(), ["a"])


@pytest.mark.parametrize("mode", ["off", "checks", "verify"])
def test_a_key_function_that_raises_is_called_once_and_chained_once(mode: str) -> None:
    calls: list[int] = []

    def key(md: object, k: int) -> int:
        calls.append(k)
        raise ValueError("no key")

    @step_cached(key=key, name="errors.key_once")
    def value(md: object, k: int) -> int:
        return k

    with stepcache.debug(mode), pytest.raises(StepCacheError) as raised:
        value(Meta(), 3)
    assert calls == [3]
    error = raised.value
    assert isinstance(error.__cause__, ValueError)
    assert error.__cause__.__context__ is None  # its own error, once
    assert error.__context__ is error.__cause__


def test_every_message_starts_the_same_way_and_carries_a_fix() -> None:
    def problems() -> list[StepCacheError]:
        found = []
        for bad in (
            lambda: step_cached(key="nope")(lambda self, k: k),
            lambda: step_cached(owner="nope")(lambda self: 1),
            lambda: step_cached(depends_on=("self",))(lambda self: 1),
            lambda: step_cached(ignore=("x",))(lambda self: 1),
            lambda: step_cached()(lambda self, k: k),
            lambda: step_cached(only={"k": "ab"}, key="k")(lambda self, k: k),
            lambda: Meta().needs_missing(),
            lambda: Meta().keyed([1]),
            lambda: Meta().key_raises(0),
        ):
            with pytest.raises(StepCacheError) as raised:
                bad()
            found.append(raised.value)
        return found

    for error in problems():
        text = str(error)
        assert text.startswith("step_cached function '"), text
        assert ". Fix: " in text, text


def test_a_missing_dependency_names_the_closest_attributes() -> None:
    class Layout:
        def __init__(self) -> None:
            self.query_start_loc = torch.tensor([0, 2])

        @step_cached(depends_on=("query_start_lco",))
        def lens(self) -> int:
            return 1

    with pytest.raises(StepCacheError, match="did you mean 'query_start_loc'"):
        Layout().lens()


def test_a_missing_dependency_is_named_past_the_parameters_depends_on_names() -> None:
    class Layout:
        query_start_loc = 1

    # the parameter ``n`` is no attribute of the owner, and is not what is missing
    @step_cached(owner="md", depends_on=("n", "query_start_lco"))
    def lens(n: int, md: object) -> int:
        return n

    with pytest.raises(StepCacheError, match="depends_on names 'query_start_lco'"):
        lens(1, Layout())


def test_a_misnamed_ignore_suggests_no_owner() -> None:
    with pytest.raises(StepCacheError) as raised:

        @step_cached(owner="md", key="n", ignore=("mdd",))
        def lens(n: int, md: object) -> int:
            return n

    assert "'md'" not in str(raised.value).split("Fix:")[1], raised.value


def test_an_unhashable_key_named_by_parameter_gets_a_parameter_s_fix() -> None:
    @step_cached(key="lens", name="errors.param_key")
    def total(md: object, lens: Any) -> int:
        return 1

    with pytest.raises(StepCacheError) as raised:
        total(Meta(), [1, 2])
    text = str(raised.value)
    assert "parameter 'lens'" in text and "key function" not in text
    with pytest.raises(StepCacheError, match="from the key function"):
        Meta().keyed([1])


@pytest.mark.parametrize("mode", ["production", "checks"])
def test_a_dependency_that_becomes_a_method_is_refused_on_every_path(mode: str) -> None:
    # the slow path (every call in checks mode) refuses a method as the generated
    # miss does, on whichever miss meets it, not only on the function's first call
    class Meta:
        source: object = 1

        def other(self) -> int:
            return 2

        @step_cached(depends_on=("source",), name="errors.becomes_method")
        def total(self) -> object:
            return self.source

    with stepcache.debug(mode if mode != "production" else "off"):
        assert Meta().total() == 1
        late = Meta()
        late.source = late.other
        with pytest.raises(StepCacheError, match="a method"):
            late.total()
