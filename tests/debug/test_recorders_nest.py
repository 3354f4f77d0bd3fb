# SPDX-License-Identifier: Apache-2.0
"""Debug mode's attribute recorder and the profiler's, used one inside the other on
the same class, in every order: each records what it should, and when both have
stopped the class reads its attributes as before (no recording wrapper left)."""

from __future__ import annotations

import itertools

import pytest

import stepcache
from stepcache._watch import Watch, watch
from stepcache.profiler._reads import ReadRecorder


class Meta:
    def __init__(self) -> None:
        self.a, self.b = 1, 2


class Guarded:
    """A class with its own ``__getattribute__``, which must come back as it was."""

    def __init__(self) -> None:
        self.a, self.b = 1, 2

    def __getattribute__(self, name: str) -> object:
        return object.__getattribute__(self, name)


ORIGINAL = {cls: cls.__dict__.get("__getattribute__") for cls in (Meta, Guarded)}


class Debug:
    """Debug mode's recorder (debug mode starts one per miss)."""

    def __init__(self, obj: object) -> None:
        self.recording = watch(obj) or Watch(obj, None)  # as debug mode starts it

    def stop(self) -> set[str]:
        return self.recording.stop()


class Profiler:
    """The profiler's recorder (one per profile; a watch per recorded call)."""

    def __init__(self, obj: object) -> None:
        self.recorder = ReadRecorder()
        handle = self.recorder.start((obj,), {})
        assert handle is not None
        self.handle = handle
        self.watch = handle[id(obj)]

    def stop(self) -> set[str]:
        self.recorder.stop(self.handle)
        return self.watch.names


def assert_restored(cls: type, obj: object) -> None:
    """The class has its own ``__getattribute__`` back, and nothing records: a new
    recorder started and stopped sees only what is read while it runs."""
    assert cls.__dict__.get("__getattribute__") is ORIGINAL[cls]
    assert type(obj).__getattribute__(obj, "a") == 1
    probe = watch(obj)
    assert probe is not None
    assert probe.stop() == set()
    _ = obj.b  # type: ignore[attr-defined]
    assert probe.names == set()


USERS = {"debug": Debug, "profiler": Profiler}
# (outer, inner, which stops first)
ORDERS = [
    (outer, inner, first)
    for outer, inner in itertools.permutations(USERS, 2)
    for first in ("inner", "outer")
]


@pytest.mark.parametrize("cls", [Meta, Guarded])
@pytest.mark.parametrize(("outer", "inner", "first"), ORDERS)
def test_nested_recorders_restore_the_class(
    cls: type, outer: str, inner: str, first: str
) -> None:
    obj = cls()
    o = USERS[outer](obj)
    _ = obj.a  # type: ignore[attr-defined]
    i = USERS[inner](obj)
    _ = obj.b  # type: ignore[attr-defined]
    if first == "inner":
        assert i.stop() == {"b"}
        _ = obj.a  # type: ignore[attr-defined]  # the outer one still records
        assert o.stop() == {"a", "b"}
    else:
        assert o.stop() == {"a", "b"}
        _ = obj.a  # type: ignore[attr-defined]  # the inner one still records
        assert i.stop() == {"a", "b"}
    assert_restored(cls, obj)


def test_profile_exit_leaves_debug_recording_running() -> None:
    """A profile that ends (``restore_all``) while debug mode still records on the
    class stops its own watches only."""
    obj = Meta()
    debug = Debug(obj)
    profiler = Profiler(obj)
    profiler.recorder.restore_all()
    _ = obj.a
    assert profiler.watch.names == set()
    assert debug.stop() == {"a"}
    assert_restored(Meta, obj)


def test_profile_in_checks_mode() -> None:
    """Through the library: a profiled step-cached method misses in checks mode (the
    profiler's recorder and debug mode's record its owner, one inside the other);
    afterwards the class is as before."""

    class Owner:
        def __init__(self) -> None:
            self.n, self.m = 3, 4

        @stepcache.step_cached(depends_on=("n",))
        def total(self) -> int:
            return self.n * 2 + self.m

    with stepcache.debug("checks"), stepcache.profile(Owner) as report:
        for _ in range(3):
            owner = Owner()
            assert owner.total() == 10
            assert owner.total() == 10
    assert report.calls == 6
    assert "__getattribute__" not in Owner.__dict__
