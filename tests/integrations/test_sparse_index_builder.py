# SPDX-License-Identifier: Apache-2.0
"""``sparse_index_builder``: the sparse-index cache as a decorator on a builder you own.

The same policy as ``sparse_index`` (one build per step for each (kind, row count) of
the SWA-only and C128A layers, every call for the others), checked through call
counts and object identity; and the configuration errors, at decoration time."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import stepcache
from stepcache.integrations.dsv4.sparse_index import (
    CACHED_KINDS,
    SparseIndexPair,
    sparse_index_builder,
)


class SWAMetadata:
    """A step's SWA metadata: the owner of the entries."""


class Layer:
    """A model's attention layer with its own sparse-index builder, decorated."""

    builds = 0

    @sparse_index_builder(name="test.layer_indices")
    def indices(
        self, swa_metadata: SWAMetadata, kind: str, num_rows: int | None
    ) -> SparseIndexPair:
        Layer.builds += 1
        rows = 3 if num_rows is None else num_rows
        return (
            torch.full((rows, 2), Layer.builds, dtype=torch.int32),
            torch.full((rows,), Layer.builds, dtype=torch.int32),
        )


@pytest.fixture(autouse=True)
def _no_builds() -> None:
    Layer.builds = 0


@pytest.mark.parametrize(
    ("kind", "builds", "same"),
    [("swa_only", 1, True), ("c128a", 1, True), ("c4a", 2, False), ("c2a", 2, False)],
)
def test_two_layers_of_a_kind(kind: str, builds: int, same: bool) -> None:
    swa = SWAMetadata()
    first = Layer().indices(swa, kind, None)
    second = Layer().indices(swa, kind, None)
    assert Layer.builds == builds
    assert (first is second) is same
    assert len(stepcache.cache_of(swa)) == (1 if same else 0)


def test_row_counts_are_separate_entries() -> None:
    swa, layer = SWAMetadata(), Layer()
    eight = layer.indices(swa, "c128a", 8)
    default = layer.indices(swa, "c128a", None)
    assert eight[0].shape[0] == 8 and default[0].shape[0] == 3
    assert layer.indices(swa, "c128a", 8) is eight
    assert Layer.builds == 2


def test_entries_live_with_their_swa_metadata() -> None:
    swa, layer = SWAMetadata(), Layer()
    pair = layer.indices(swa, "swa_only", None)
    # a copy, and the next step's metadata, are other steps for this cache
    assert layer.indices(copy.copy(swa), "swa_only", None) is not pair
    assert layer.indices(SWAMetadata(), "swa_only", None) is not pair
    assert layer.indices(swa, "swa_only", None) is pair
    assert Layer.builds == 3


def test_a_builder_without_a_row_count_is_keyed_by_kind() -> None:
    seen: list[tuple[str, int]] = []

    @sparse_index_builder(owner="swa", num_rows=None)
    def build(swa: SWAMetadata, kind: str, layer: int) -> SparseIndexPair:
        seen.append((kind, layer))
        return torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)

    swa = SWAMetadata()
    for layer, kind in enumerate(("swa_only", "swa_only", "c4a", "c128a", "c4a")):
        build(swa, kind, layer)
    # the layer index is not part of the key: the second SWA-only layer shares
    assert seen == [("swa_only", 0), ("c4a", 2), ("c128a", 3), ("c4a", 4)]


def test_a_pair_that_breaks_the_spec_is_refused_and_not_cached() -> None:
    @sparse_index_builder(owner="swa", num_rows=None)
    def build(swa: SWAMetadata, kind: str) -> SparseIndexPair:
        return torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)

    swa = SWAMetadata()
    for _ in range(2):
        with pytest.raises(stepcache.CacheValidationError, match=r"result\[0\] dtype"):
            build(swa, "c128a")
    assert len(stepcache.cache_of(swa)) == 0


def _builder(*names: str) -> Callable[..., SparseIndexPair]:
    """A builder whose parameters are ``names``."""
    namespace: dict[str, Any] = {}
    exec(f"def build({', '.join(names)}): return None", namespace)  # noqa: S102
    fn: Callable[..., SparseIndexPair] = namespace["build"]
    return fn


@pytest.mark.parametrize(
    ("options", "params", "named"),
    [
        ({}, ("swa", "kind", "num_rows"), "swa_metadata"),
        ({"owner": "swa"}, ("swa", "layer_kind", "num_rows"), "kind"),
        ({"owner": "swa"}, ("swa", "kind"), "num_rows"),
    ],
)
def test_a_name_that_is_not_a_parameter_is_a_typed_error(
    options: dict[str, Any], params: tuple[str, ...], named: str
) -> None:
    with pytest.raises(stepcache.StepCacheError, match=named):
        sparse_index_builder(**options)(_builder(*params))


@pytest.mark.parametrize(
    "options",
    [{"owner": ""}, {"kind": 3}, {"num_rows": ""}, {"owner": None}],
)
def test_a_malformed_option_is_a_typed_error(options: dict[str, Any]) -> None:
    with pytest.raises(stepcache.StepCacheError, match="must name a parameter"):
        sparse_index_builder(**options)


_KINDS = st.sampled_from(["swa_only", "c128a", "c4a", "c2a"])
_ROWS = st.sampled_from([None, 1, 8])


@given(calls=st.lists(st.tuples(_KINDS, _ROWS), max_size=30))
def test_one_build_per_cached_key_and_one_per_other_call(
    calls: list[tuple[str, int | None]],
) -> None:
    Layer.builds = 0
    swa, layer = SWAMetadata(), Layer()
    first: dict[tuple[str, int | None], SparseIndexPair] = {}
    for kind, rows in calls:
        pair = layer.indices(swa, kind, rows)
        if kind in CACHED_KINDS:
            assert first.setdefault((kind, rows), pair) is pair
    uncached = sum(kind not in CACHED_KINDS for kind, _ in calls)
    assert Layer.builds == len(first) + uncached
    assert len(stepcache.cache_of(swa)) == len(first)
