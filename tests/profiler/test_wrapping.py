# SPDX-License-Identifier: Apache-2.0
"""Nothing is wrapped while no profile is active: the originals are back after the
block, also when it raises, in every module that imported them."""

from __future__ import annotations

import asyncio
import inspect
import sys
import types
from collections.abc import Iterator

import pytest

import stepcache
from stepcache.profiler import ProfilerError

from . import sample

MOD = sample.__name__


def snapshot() -> dict[str, object]:
    """Every attribute of the sample module and of its class, as stored."""
    out = {f"mod.{k}": v for k, v in vars(sample).items()}
    out.update({f"Builder.{k}": v for k, v in vars(sample.Builder).items()})
    return out


@pytest.fixture
def alias() -> Iterator[types.ModuleType]:
    """A module that did ``from sample import total as renamed``."""
    module = types.ModuleType("profiler_alias_module")
    module.renamed = sample.total  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_wrapped_inside_restored_after(alias: types.ModuleType) -> None:
    before = snapshot()
    with stepcache.profile(MOD) as report:
        assert sample.total is not before["mod.total"]
        assert alias.renamed is sample.total  # the alias is wrapped too
        assert sample.total.__wrapped__ is before["mod.total"]  # type: ignore[attr-defined]
        assert sample.total.__name__ == "total"
        assert isinstance(vars(sample.Builder)["helper"], staticmethod)
        assert isinstance(vars(sample.Builder)["make"], classmethod)
        assert sample.Builder.helper(1) == 2
        assert isinstance(sample.Builder.make(), sample.Builder)
        assert alias.renamed(sample.make_step([1, 2]).query_lens) == 3
    assert snapshot() == before
    assert all(snapshot()[k] is v for k, v in before.items())
    assert alias.renamed is before["mod.total"]
    assert report["total"].calls == 1
    assert report["Builder.helper"].calls == 1
    assert report["Builder.make"].calls == 1


def test_restored_when_the_block_raises() -> None:
    before = snapshot()
    with pytest.raises(ZeroDivisionError), stepcache.profile(MOD) as report:
        sample.total(sample.make_step([1]).query_lens)
        1 / 0  # noqa: B018
    assert all(snapshot()[k] is v for k, v in before.items())
    assert report["total"].calls == 1  # the report is still complete


def test_restored_when_a_profiled_call_raises() -> None:
    before = snapshot()
    with pytest.raises(AttributeError), stepcache.profile(MOD) as report:
        sample.total(None)  # type: ignore[arg-type]
    assert all(snapshot()[k] is v for k, v in before.items())
    row = report["total"]
    assert (row.calls, row.errors, row.redundant) == (1, 1, 0)


def test_a_wrapper_kept_after_the_block_calls_straight_through() -> None:
    with stepcache.profile(f"{MOD}:total") as report:
        kept = sample.total
    assert kept(sample.make_step([4]).query_lens) == 4
    assert report.calls == 0


def test_a_replacement_made_during_the_block_is_left_alone() -> None:
    original = sample.total

    def replacement(query_lens: object) -> int:
        return 0

    try:
        with stepcache.profile(f"{MOD}:total") as report:
            sample.total = replacement
        assert sample.total is replacement
        assert report.not_restored == (f"{MOD}.total ({MOD}:total)",)
    finally:
        sample.total = original


def test_profiles_do_not_nest_and_are_used_once() -> None:
    p = stepcache.profile(f"{MOD}:total")
    with p:
        with (
            pytest.raises(ProfilerError, match="do not nest"),
            stepcache.profile(f"{MOD}:scaled"),
        ):
            pass  # pragma: no cover
        assert sample.scaled.__module__ == MOD and not hasattr(
            sample.scaled, "__wrapped__"
        )
    with pytest.raises(ProfilerError, match="used once"), p:
        pass  # pragma: no cover


def test_the_report_is_read_after_the_block() -> None:
    with stepcache.profile(f"{MOD}:total") as report:
        with pytest.raises(ProfilerError, match="after the block"):
            report.functions  # noqa: B018
        assert "profiling" in repr(report)
    with pytest.raises(ProfilerError, match="inside the profiled block"):
        report.step()
    with pytest.raises(KeyError, match="no profiled function"):
        report["nothing"]


def test_a_second_name_in_its_own_module_is_one_target() -> None:
    """``make = build`` in the profiled module: one wrapper, reported as ``build``."""
    module = types.ModuleType("profiler_second_name_module")
    exec("def build(x):\n    return x\nmake = build\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        with stepcache.profile(module.__name__) as report:
            module.build(1), module.make(1)
        assert report.not_restored == ()
        assert (
            module.make is module.build and module.build.__module__ == module.__name__
        )
        assert [(r.name, r.calls) for r in report.functions] == [
            (f"{module.__name__}:build", 2)
        ]
    finally:
        del sys.modules[module.__name__]


async def fetch(x: int) -> int:
    await asyncio.sleep(0.01)
    return x


def test_a_coroutine_function_stays_one_and_is_timed_to_its_return() -> None:
    with stepcache.profile(f"{__name__}:fetch") as report:
        assert inspect.iscoroutinefunction(fetch)
        assert asyncio.run(fetch(1)) == 1
    row = report["fetch"]
    assert (row.calls, row.errors, row.suggestion) == (1, 0, None)
    assert row.total_ns >= 10_000_000  # the await included, not just the creation
