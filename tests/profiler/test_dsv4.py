# SPDX-License-Identifier: Apache-2.0
"""The profiler on the DSv4 simulation: with no stepcache decorators it finds the two
caches of the seed PRs (the request index, the per-layer sparse indices) by itself, and
the decorators it suggests make the uncached variant compute each once per step."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import stepcache
from stepcache.integrations.dsv4 import sim as dsv4_sim
from stepcache.profiler import ProfileReport

from . import workloads

TARGETS = (
    "stepcache.integrations.dsv4.sim",
    "stepcache.integrations.dsv4.seed",
    "stepcache.integrations.dsv4.request_index",
)
REQUEST_INDEX = "stepcache.integrations.dsv4.sim:Builders.request_index"
SPARSE_INDEX = "stepcache.integrations.dsv4.sim:Builders.layer_sparse_index"


@pytest.fixture(scope="module")
def report() -> ProfileReport:
    with stepcache.profile(TARGETS, step=dsv4_sim.run_step) as report:
        workloads.dsv4_uncached()
    return report


def test_the_two_seed_caches_rank_first(report: ProfileReport) -> None:
    assert report.steps == 8
    top = {r.name for r in report.redundant[:2]}  # ranked by time: either order
    assert top == {SPARSE_INDEX, REQUEST_INDEX}
    # What they call is found too, but as inside them: caching the outer call skips it.
    for inner in ("Builders._computed_index", "uncached_token_to_req_indices"):
        row = report[inner]
        assert row.redundant and row.uncovered_ns == 0
        assert row.inside == REQUEST_INDEX
    assert report["Builders.build_sparse_indices"].inside == SPARSE_INDEX


def test_calls_per_step(report: ProfileReport) -> None:
    layers = len(dsv4_sim.DSV4_LAYERS)
    sparse, index = report[SPARSE_INDEX], report[REQUEST_INDEX]
    assert (sparse.calls_per_step, sparse.max_calls_per_step) == (layers, layers)
    assert (index.calls_per_step, index.calls) == (3.0, 24)
    # The three builders pass three buffers: no two calls have identical arguments,
    # the profiler finds them through their equal results.
    assert index.identical == 0 and index.redundant == 2 * 8
    swa_only = dsv4_sim.DSV4_LAYERS.count("swa_only")
    c128a = dsv4_sim.DSV4_LAYERS.count("c128a")
    assert sparse.redundant == 8 * ((swa_only - 1) + (c128a - 1))


def test_suggestions_match_the_seed_prs(report: ProfileReport) -> None:
    index = report[REQUEST_INDEX].suggestion
    assert index is not None
    assert (index.owner, index.key, index.bypass) == ("meta", (), None)
    assert index.ignored == ("buffer",)
    # what the seed's code reads: the host layout and the padded row count
    assert set(index.depends_on) == {"query_start_loc_cpu", "num_actual_tokens"}
    sparse = report[SPARSE_INDEX].suggestion
    assert sparse is not None
    # PR #45863: one entry per layer kind, C4A layers stay uncached.
    assert (sparse.owner, sparse.key, sparse.bypass) == (
        "swa",
        ("kind",),
        ("kind", ("c4a",)),
    )
    assert sparse.ignored == ("layer",)
    assert (
        sparse.decorator is not None
        and "stepcache.BYPASS if kind == 'c4a'" in sparse.decorator
    )


@pytest.fixture
def decorated(report: ProfileReport) -> Iterator[type[dsv4_sim.Builders]]:
    """Builders whose two methods carry the decorators the profiler printed."""
    namespace = {"stepcache": stepcache}
    methods = {}
    for name in (REQUEST_INDEX, SPARSE_INDEX):
        line = report[name].suggestion.decorator  # type: ignore[union-attr]
        assert line is not None and line.startswith("@")
        decorator = eval(line[1:], namespace)
        attr = name.rpartition(".")[2]
        methods[attr] = decorator(getattr(dsv4_sim.Builders, attr))
    yield type("SuggestedBuilders", (dsv4_sim.Builders,), methods)


def test_the_suggested_decorators_work(decorated: type[dsv4_sim.Builders]) -> None:
    plain, cached = dsv4_sim.Builders(64), decorated(64)
    kinds = dsv4_sim.DSV4_LAYERS
    # Verify mode recomputes every hit and raises if a cached value differs.
    with stepcache.debug("verify"):
        for lens in workloads.BATCHES * 2:
            meta = dsv4_sim.make_step(lens, pad_to=sum(lens) + 2)
            expect = dsv4_sim.run_step(meta, plain, "uncached")
            got = dsv4_sim.run_step(
                dsv4_sim.make_step(lens, pad_to=sum(lens) + 2), cached, "uncached"
            )
            assert all(
                torch.equal(a, b)
                for a, b in zip(expect.indices, got.indices, strict=True)
            )
            for (a, b), (c, d) in zip(expect.sparse, got.sparse, strict=True):
                assert torch.equal(a, c) and torch.equal(b, d)
    # Verify mode recomputes every hit: count the production run's builds instead.
    cached.index_computations = cached.sparse_builds = 0
    for lens in workloads.BATCHES:
        dsv4_sim.run_step(dsv4_sim.make_step(lens), cached, "uncached")
    steps = len(workloads.BATCHES)
    assert cached.index_computations == steps
    assert cached.sparse_builds == steps * (1 + 1 + kinds.count("c4a"))


def test_the_stepcache_variant_leaves_nothing_to_find() -> None:
    # The decorated builder holds the function it wraps, so the profiler (which
    # patches module and class attributes) watches what every build calls.
    with stepcache.profile(
        [
            "stepcache.integrations.dsv4.request_index:request_index_array",
            "stepcache.integrations.dsv4.sim:sparse_pair",
        ],
        step=dsv4_sim.run_step,
    ) as report:
        workloads.dsv4_stepcache()
    assert report["request_index_array"].calls_per_step == 1.0
    kinds = dsv4_sim.DSV4_LAYERS
    assert report["sparse_pair"].calls_per_step == 2 + kinds.count("c4a")
    assert report.redundant == ()
