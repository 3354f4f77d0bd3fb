# SPDX-License-Identifier: Apache-2.0
"""Threads: two owners in two threads never mix; one owner in many threads stays sound."""

from __future__ import annotations

import threading

import torch

import stepcache
from stepcache import step_cached


class Meta:
    def __init__(self, tag: int) -> None:
        self.tag = tag
        self.qsl = torch.tensor([0, tag])

    @step_cached(key="k", depends_on=("qsl",))
    def value(self, k: int) -> tuple[int, int]:
        return (self.tag, k)


def _hammer(
    barrier: threading.Barrier, work: list[tuple[Meta, int]], errors: list[str]
) -> None:
    barrier.wait()
    for _ in range(200):
        for owner, k in work:
            got = owner.value(k)
            if got != (owner.tag, k):
                errors.append(f"owner {owner.tag} key {k} got {got}")


def _in_threads(works: list[list[tuple[Meta, int]]]) -> list[str]:
    """Run ``_hammer`` on each work list in a thread of its own, all started together;
    return the wrong values seen."""
    errors: list[str] = []
    barrier = threading.Barrier(len(works))
    threads = [
        threading.Thread(target=_hammer, args=(barrier, work, errors)) for work in works
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_two_owners_in_two_threads_never_see_each_other() -> None:
    a, b = Meta(1), Meta(2)
    assert _in_threads([[(o, k) for k in range(8)] for o in (a, b)]) == []
    assert len(stepcache.cache_of(a)) == 8 and len(stepcache.cache_of(b)) == 8


def test_one_owner_from_many_threads_is_never_corrupted() -> None:
    owner = Meta(7)
    works = [[(owner, (k + i) % 16) for k in range(16)] for i in range(4)]
    assert _in_threads(works) == []
    store = stepcache.cache_of(owner)
    assert len(store) == 16
    assert sorted(
        k for _, (_, k) in ((f, e.value) for f, e in store.entries())
    ) == list(range(16))


def test_first_calls_on_fresh_owners_from_many_threads() -> None:
    # no lock on a fresh owner's first call: every thread still gets its own owner's
    # values, and each owner ends with one store holding every key
    owners = [Meta(i) for i in range(32)]
    works = [[(o, (k + i) % 4) for o in owners for k in range(4)] for i in range(4)]
    assert _in_threads(works) == []
    for owner in owners:
        store = stepcache.cache_of(owner)
        assert sorted(e.value[1] for _, e in store.entries()) == [0, 1, 2, 3]
