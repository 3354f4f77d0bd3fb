# SPDX-License-Identifier: Apache-2.0
"""The DSv4 sparse-index cache, tested the way vLLM tests its own: a counting fake
index builder, two calls per layer kind, call counts and object identity."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import stepcache
from stepcache.integrations.dsv4.sparse_index import (
    CACHED_KINDS,
    SparseIndexPair,
    layer_kind,
    sparse_index,
)


class SWAMetadata:
    """A step's SWA metadata: the owner of the entries."""


class CountingBuilder:
    """Builds a fresh pair on every call, and counts the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> SparseIndexPair:
        self.calls += 1
        return (
            torch.tensor([[self.calls]], dtype=torch.int32),
            torch.tensor([self.calls], dtype=torch.int32),
        )


@pytest.mark.parametrize(
    ("kind", "builds", "same"),
    [("swa_only", 1, True), ("c128a", 1, True), ("c4a", 2, False)],
)
def test_two_calls_per_kind(kind: str, builds: int, same: bool) -> None:
    build = CountingBuilder()
    swa = SWAMetadata()
    first = sparse_index(swa, kind, None, build)
    second = sparse_index(swa, kind, None, build)
    assert build.calls == builds
    assert (first[0] is second[0]) is same
    assert (first[1] is second[1]) is same


def test_kinds_and_row_counts_are_separate_entries() -> None:
    build = CountingBuilder()
    swa = SWAMetadata()
    pairs = {
        (kind, rows): sparse_index(swa, kind, rows, build)
        for kind in ("swa_only", "c128a")
        for rows in (None, 8)
    }
    assert build.calls == 4
    assert len({id(p[0]) for p in pairs.values()}) == 4
    for (kind, rows), pair in pairs.items():
        assert sparse_index(swa, kind, rows, build) is pair
    assert build.calls == 4


def test_entries_live_and_die_with_their_swa_metadata() -> None:
    build = CountingBuilder()
    swa = SWAMetadata()
    pair = sparse_index(swa, "c128a", None, build)
    # a copy is another step's object for this cache: it builds its own
    assert sparse_index(copy.copy(swa), "c128a", None, build) is not pair
    # and the next step's metadata too
    assert sparse_index(SWAMetadata(), "c128a", None, build) is not pair
    assert build.calls == 3
    assert len(stepcache.cache_of(swa)) == 1


def test_unknown_kinds_are_never_cached() -> None:
    build = CountingBuilder()
    swa = SWAMetadata()
    for _ in range(3):
        sparse_index(swa, "c2a", None, build)
    assert build.calls == 3
    assert len(stepcache.cache_of(swa)) == 0


def test_a_pair_of_the_wrong_shape_is_refused_and_not_cached() -> None:
    swa = SWAMetadata()

    def flat() -> SparseIndexPair:
        return torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)

    with pytest.raises(stepcache.CacheValidationError, match=r"result\[0\] ndim"):
        sparse_index(swa, "swa_only", None, flat)

    def int64() -> SparseIndexPair:
        return torch.zeros(4, 2, dtype=torch.int32), torch.zeros(4, dtype=torch.int64)

    with pytest.raises(stepcache.CacheValidationError, match=r"result\[1\] dtype"):
        sparse_index(swa, "swa_only", None, int64)
    assert len(stepcache.cache_of(swa)) == 0


@given(swa_only=st.booleans(), ratio=st.integers(0, 512))
def test_layer_kind_names_the_kinds_as_vllm_does(swa_only: bool, ratio: int) -> None:
    kind = layer_kind(swa_only, ratio)
    if swa_only:
        assert kind == "swa_only"
    else:
        assert kind == ("c128a" if ratio == 128 else "c4a")
    assert (kind in CACHED_KINDS) == (swa_only or ratio == 128)
