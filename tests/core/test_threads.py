# SPDX-License-Identifier: Apache-2.0
"""Threads: two owners in two threads never mix; one owner in many threads stays sound;
a dependency changed by another thread is never served stale.

Every test runs with a switch interval of 1 µs (the default, 5 ms, is longer than a
thread's whole loop here): the interpreter asks the running thread to hand over the
GIL every microsecond, inside stepcache's hit and miss code too. How often the threads
really take turns then depends on how soon the OS runs the waiting one (on a 2-core
CI virtual machine, measured: about 170 turns a second, against 90 with the default
interval), so the cached functions also release the GIL in the middle of their work,
as a builder's tensor work does, and each test counts the turns and keeps its threads
going until they have taken :data:`MIN_TURNS` of them (at most :data:`DEADLINE_S`
seconds), then asserts that they did.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

import stepcache
from stepcache import step_cached

#: the switch interval the tests run with, in seconds
SWITCH_INTERVAL = 1e-6
#: turns between threads a test must see
MIN_TURNS = 50
#: how long a test's threads may run to take them
DEADLINE_S = 8.0


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """Within the block, ask for a thread switch every ``seconds``; restored after."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.fixture(autouse=True)
def fast_switches() -> Iterator[None]:
    """Every test here runs with a switch every 1 µs."""
    with switch_interval(SWITCH_INTERVAL):
        yield


def test_the_tests_switch_every_microsecond_and_restore_the_interval() -> None:
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    with pytest.raises(KeyError), switch_interval(0.002):
        assert sys.getswitchinterval() == pytest.approx(0.002)
        raise KeyError  # restored on the way out of a failure too
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)


class Turns:
    """Which thread ran last, how many times that changed, and whether to stop."""

    def __init__(self) -> None:
        self.last = -1
        self.count = 0
        self.deadline = time.monotonic() + DEADLINE_S

    def mark(self, me: int) -> None:
        if self.last != me:  # not atomic: a close count is enough
            self.last = me
            self.count += 1

    def enough(self) -> bool:
        return self.count >= MIN_TURNS or time.monotonic() > self.deadline


def _in_threads(bodies: list[Callable[[], None]], turns: Turns) -> None:
    """Run each body in a thread of its own, all released together; re-raise the
    first failure; assert that the threads took turns often enough."""
    barrier = threading.Barrier(len(bodies))
    failures: list[BaseException] = []

    def run(body: Callable[[], None]) -> None:
        barrier.wait()
        try:
            body()
        except BaseException as error:  # re-raised in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]
    assert turns.count >= MIN_TURNS, (
        f"the threads took {turns.count} turns in {DEADLINE_S} s: they hardly "
        "interleaved, so this run shows little"
    )


class Meta:
    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.qsl = torch.tensor([0, tag])

    @step_cached(key="k", depends_on=("qsl",))
    def value(self, k: int) -> tuple[int, int]:
        _release_the_gil()
        return (self.tag, k)

    @step_cached(depends_on=("qsl",))
    def generation(self) -> int:
        g = int(self.qsl[1])
        _release_the_gil()
        return g


def _release_the_gil() -> None:
    """What a builder's tensor work does: let another thread run, here in the middle
    of a miss (after the dependencies were fingerprinted, before the entry is
    stored), where a switch interval alone rarely lands."""
    time.sleep(0)


def _hits_of_a_pass(owner: Meta, keys: range) -> int:
    """Call ``owner.value(k)`` for each key in this thread, check each value, and
    return how many of the calls were hits."""
    before = stepcache.stats()["Meta.value"].hits
    for k in keys:
        assert owner.value(k) == (owner.tag, k)
    return stepcache.stats()["Meta.value"].hits - before


def _hammer(me: int, work: list[tuple[Meta, int]], turns: Turns) -> Callable[[], None]:
    """Call ``owner.value(k)`` for each pair of ``work``, over and over, until the
    threads took enough turns (at least 200 rounds)."""

    def body() -> None:
        rounds = 0
        while rounds < 200 or not turns.enough():
            for owner, k in work:
                turns.mark(me)
                got = owner.value(k)
                assert got == (owner.tag, k), f"owner {owner.tag} key {k} got {got}"
            rounds += 1

    return body


def test_two_owners_in_two_threads_never_see_each_other() -> None:
    a, b = Meta(1), Meta(2)
    turns = Turns()
    works = [[(o, k) for k in range(8)] for o in (a, b)]
    _in_threads([_hammer(i, work, turns) for i, work in enumerate(works)], turns)
    assert _hits_of_a_pass(a, range(8)) == 8 and _hits_of_a_pass(b, range(8)) == 8


def test_one_owner_from_many_threads_is_never_corrupted() -> None:
    owner = Meta(7)
    turns = Turns()
    works = [[(owner, (k + i) % 16) for k in range(16)] for i in range(4)]
    _in_threads([_hammer(i, work, turns) for i, work in enumerate(works)], turns)
    assert _hits_of_a_pass(owner, range(16)) == 16  # every key stored, and right


def test_first_calls_on_fresh_owners_from_many_threads() -> None:
    # No lock on a fresh owner's first call: threads that make it at once may each
    # create a store (or a key table in it), and the one written last stays; the
    # others' entries are lost and computed again on their next use (docs/concepts.md,
    # Threads). Every thread still gets its own owner's values, every entry left holds
    # the right value, and each owner's one store then fills up and hits as usual.
    owners = [Meta(i) for i in range(20_000)]
    turns = Turns()
    reached = [0] * 4

    def walker(me: int) -> Callable[[], None]:
        def body() -> None:
            for n, owner in enumerate(owners):
                if n >= 200 and turns.enough():
                    break
                for k in range(4):
                    turns.mark(me)
                    key = (k + me) % 4
                    assert owner.value(key) == (owner.tag, key)
                reached[me] = n + 1

        return body

    _in_threads([walker(i) for i in range(4)], turns)
    for owner in owners[: max(reached)]:
        store = stepcache.cache_of(owner)
        _hits_of_a_pass(owner, range(4))  # right values; refills what a race lost
        assert _hits_of_a_pass(owner, range(4)) == 4
        assert stepcache.cache_of(owner) is store


@pytest.mark.parametrize("change", ["reassigned", "written in place"])
def test_a_dependency_changed_by_another_thread_is_never_served_stale(
    change: str,
) -> None:
    # A writer moves the owner's qsl on to generation 1, 2, ... and then publishes the
    # generation; readers check that no call returns a generation older than the one
    # published before the call began: a value computed from a qsl that had already
    # been replaced would be.
    owner = Meta(0)
    if change == "written in place":
        # a persistent buffer (made before any step): an inference tensor's in-place
        # writes are not seen in production (tests/core/test_inference.py)
        with torch.inference_mode(False):
            owner.qsl = torch.tensor([0, 0])
    published = [0]
    done = threading.Event()
    turns = Turns()

    def writer() -> None:
        try:
            g = 0
            while g < 300 or not turns.enough():
                g += 1
                turns.mark(0)
                if change == "reassigned":
                    owner.qsl = torch.tensor([0, g])
                else:
                    owner.qsl[1] = g
                published[0] = g
                _release_the_gil()  # as the engine thread's own work would
        finally:
            done.set()

    def reader(me: int) -> Callable[[], None]:
        def body() -> None:
            while not done.is_set():
                turns.mark(me)
                before = published[0]
                got = owner.generation()
                assert got >= before, f"generation {got} served after {before}"

        return body

    _in_threads([writer, reader(1), reader(2)], turns)
    assert owner.generation() == published[0] >= 300
    # the readers' calls found the qsl changed under them, again and again
    assert stepcache.stats()["Meta.generation"].invalidations >= 20
