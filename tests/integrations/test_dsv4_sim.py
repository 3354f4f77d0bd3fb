# SPDX-License-Identifier: Apache-2.0
"""The engine-free DSv4 step: the three variants agree, and do the work they should."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepcache.integrations.dsv4.sim import (
    DSV4_LAYERS,
    VARIANTS,
    Builders,
    StepResult,
    Variant,
    make_step,
    run_step,
)

query_lens = st.lists(st.integers(0, 6), min_size=0, max_size=8)
padding = st.one_of(st.none(), st.integers(0, 5))


def snapshot(result: StepResult) -> list[list[int]]:
    """The result's values, copied out of the builders' reused buffers."""
    out = [t.tolist() for t in result.indices] + [result.positions.tolist()]
    for indices, lens in result.sparse:
        out += [indices.flatten().tolist(), lens.tolist()]
    return out


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(query_lens, padding), min_size=1, max_size=3))
def test_the_three_variants_give_the_same_results(
    steps: list[tuple[list[int], int | None]],
) -> None:
    builders = {v: Builders(max_tokens=64) for v in VARIANTS}
    for lens, pad in steps:
        pad_to = None if pad is None else sum(lens) + pad
        results = {
            v: snapshot(run_step(make_step(lens, pad_to=pad_to), builders[v], v))
            for v in VARIANTS
        }
        assert results["handwritten"] == results["uncached"]
        assert results["stepcache"] == results["uncached"]


@pytest.mark.parametrize(
    ("variant", "index_computations", "sparse_builds"),
    [
        ("uncached", 3, len(DSV4_LAYERS)),
        # one build for the SWA-only layers, one for the C128A layers, one per C4A layer
        ("handwritten", 1, 2 + DSV4_LAYERS.count("c4a")),
        ("stepcache", 1, 2 + DSV4_LAYERS.count("c4a")),
    ],
)
def test_work_per_step(
    variant: Variant, index_computations: int, sparse_builds: int
) -> None:
    builders = Builders(max_tokens=64)
    for lens in ([3, 1, 1], [1, 1], [5, 0, 2, 2]):
        result = run_step(make_step(lens, pad_to=16), builders, variant)
        assert result.index_computations == index_computations
        assert result.sparse_builds == sparse_builds


def test_c4a_layers_get_their_own_indices() -> None:
    result = run_step(make_step([40, 3]), Builders(max_tokens=64), "stepcache")
    by_kind = list(zip(DSV4_LAYERS, result.sparse, strict=True))
    c4a = [pair for kind, pair in by_kind if kind == "c4a"]
    assert not torch.equal(c4a[0][0], c4a[1][0])
    c128a = [pair for kind, pair in by_kind if kind == "c128a"]
    assert all(pair[0] is c128a[0][0] for pair in c128a)


def test_the_handwritten_cache_keeps_the_old_layout_and_stepcache_does_not() -> None:
    """The draft loop reassigns the layout of the same metadata object."""
    results = {}
    variants: tuple[Variant, ...] = ("handwritten", "stepcache")
    for variant in variants:
        builders = Builders(max_tokens=64)
        meta = make_step([3, 2, 2])
        run_step(meta, builders, variant)
        meta.num_actual_tokens = 3
        meta.query_start_loc = torch.arange(4, dtype=torch.int32)
        meta.query_start_loc_cpu = torch.arange(4, dtype=torch.int32)
        results[variant] = builders.build_sparse_mla(meta, variant).tolist()
    assert results["handwritten"] == [0, 0, 0]  # the first rows of [0,0,0,1,1,2,2]
    assert results["stepcache"] == [0, 1, 2]


def test_make_step_refuses_bad_layouts() -> None:
    with pytest.raises(ValueError, match="query_lens must be >= 0"):
        make_step([1, -1])
    with pytest.raises(ValueError, match="pad_to=2 is below the 3 tokens"):
        make_step([3], pad_to=2)
    with pytest.raises(ValueError, match="one context length per request"):
        make_step([1, 2], [4])
    with pytest.raises(ValueError, match="variant must be one of"):
        run_step(make_step([1]), Builders(8), "lru")  # type: ignore[arg-type]


@pytest.mark.parametrize("variant", ["uncached", "handwritten"])
def test_the_baselines_are_the_seeds_code_not_stepcaches_helpers(
    variant: Variant, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "uncached" and "handwritten" run the seeds' code (stepcache.integrations.dsv4
    # .seed): a baseline built on stepcache's validating helpers measures the helpers
    from stepcache.integrations.dsv4 import request_index

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a baseline called one of stepcache's helpers")

    for helper in ("request_index_array", "total_tokens", "write_request_index"):
        monkeypatch.setattr(request_index, helper, refuse)
    result = run_step(make_step([3, 0, 1], pad_to=6), Builders(8), variant)
    assert [t.tolist() for t in result.indices] == [[0, 0, 0, 2, 0, 0]] * 3
    assert result.index_computations == (3 if variant == "uncached" else 1)


def test_the_seeds_hit_asserts_as_the_pr() -> None:
    from stepcache.integrations.dsv4 import seed

    meta = seed.SeedMetadata(*[torch.tensor([0, 2, 5], dtype=torch.int32)] * 2, 5)
    meta.token_to_req_indices(torch.zeros(8, dtype=torch.int32))
    with pytest.raises(AssertionError):  # the cached rows are int32, on the CPU
        meta.token_to_req_indices(torch.zeros(8, dtype=torch.int32, device="meta"))
    meta.num_actual_tokens = 9  # more rows than were cached
    with pytest.raises(AssertionError):
        meta.token_to_req_indices(torch.zeros(16, dtype=torch.int32))
