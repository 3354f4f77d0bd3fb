# SPDX-License-Identifier: Apache-2.0
"""How low a cache behind a function call can go: the DSv4 step, one part swapped at a time.

Run: ``python -m benchmarks.bench_floor [--rounds N] [--quick]``.

The DSv4 goal of ``bench_dsv4`` (stepcache <= 1.05x the hand-written build) compares a
library with the seed PRs' caches written inline. This benchmark splits the
difference on the same step, timed the same way (the variants interleaved in a random
order each round, ratios of the two steps of one round, a second hand-written build
as the control). Each variant swaps one part:

* ``stepcache``: both integrations, as ``bench_dsv4`` times them (the layers' builder
  decorated with
  :func:`~stepcache.integrations.dsv4.sparse_index.sparse_index_builder`);
* ``stepcache request index``: stepcache's
  :func:`~stepcache.integrations.dsv4.request_index.token_to_req_indices` for the three
  builders, the layers' cache hand-written;
* ``stepcache sparse index``: the layers' decorated builder, the request index
  hand-written (as in every variant below);
* ``stepcache sparse_index()``: the layers' builder called through
  :func:`~stepcache.integrations.dsv4.sparse_index.sparse_index` (the form for a builder
  you do not own: ``sparse_index(swa, kind, num_rows, build, *args)``);
* ``minimal decorator``: that call-through form with the smallest per-owner
  decorator that stays correct for a copied owner (:func:`minimal_cached`): a store
  per owner, made on its first call; a hit checks the store's owner through a weak
  reference; a miss and a C4A call go through the decorated function. No dependency
  checks, no validation, no statistics, no debug mode;
* ``plain function``: the seed's dict cache moved into a function of that form (one
  Python call per layer more than the seed).

The call-through columns show what each step away from inline code costs in that form
of the call; the decorated builder, what stepcache costs in the form a model's own
code uses.
"""

from __future__ import annotations

import functools
import random
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, cast

import attrs
import torch

from benchmarks._report import markdown_table
from benchmarks.bench_dsv4 import (
    CONTROL,
    batch_layout,
    main_with_rounds,
    paired_ratio,
    sweep,
    time_rounds,
)
from demo import demo
from stepcache.integrations.dsv4 import sim as dsv4_sim
from stepcache.integrations.dsv4 import sparse_index

TOKENS: tuple[int, ...] = (1, 4, 16, 64)
LAYERS: tuple[int, ...] = (8,)
#: timed steps per variant and point
ROUNDS = 151

#: label -> the variant name :class:`FloorBuilders` understands, in column order
VARIANTS: Final[dict[str, str]] = {
    "hand-written": "handwritten",
    "stepcache request index": "floor:request-index",
    "plain function": "floor:function",
    "minimal decorator": "floor:decorator",
    "stepcache sparse_index()": "floor:call-through",
    "stepcache sparse index": "floor:stepcache",
    "stepcache": "stepcache",
    CONTROL: "handwritten",
}

_F = TypeVar("_F", bound=Callable[..., Any])


class _Store:
    """The minimal decorator's per-owner store."""

    __slots__ = ("entries", "owner")

    def __init__(self, owner: object) -> None:
        self.entries: dict[Any, Any] = {}
        self.owner = weakref.ref(owner)


def minimal_cached(only: frozenset[str]) -> Callable[[_F], _F]:
    """Cache ``fn(owner, kind, num_rows, ...)`` per owner and ``(kind, num_rows)``,
    for the kinds in ``only``; other kinds call ``fn`` each time.

    >>> class Owner: pass
    >>> calls = []
    >>> @minimal_cached(frozenset({"a"}))
    ... def f(owner, kind, num_rows):
    ...     calls.append(kind)
    ...     return len(calls)
    >>> o = Owner()
    >>> f(o, "a", None), f(o, "a", None), f(o, "b", None), f(o, "b", None)
    (1, 1, 2, 3)
    >>> import copy; f(copy.copy(o), "a", None)  # a copy has a store of its own
    4
    """

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def cached(owner: Any, kind: str, num_rows: int | None, *args: Any) -> Any:
            if kind not in only:
                return fn(owner, kind, num_rows, *args)
            key = (kind, num_rows)
            store = getattr(owner, "_minimal_store", None)
            if store is not None and store.owner() is owner:
                value = store.entries.get(key)
                if value is not None:
                    return value
            else:
                store = _Store(owner)
                owner._minimal_store = store
            value = fn(owner, kind, num_rows, *args)
            store.entries[key] = value
            return value

        return cast(_F, cached)

    return wrap


@minimal_cached(sparse_index.CACHED_KINDS)
def _decorated_sparse_index(
    swa: object,
    kind: str,
    num_rows: int | None,
    build: Callable[..., sparse_index.SparseIndexPair],
    *args: Any,
) -> sparse_index.SparseIndexPair:
    return build(*args)


def _function_sparse_index(
    swa: dsv4_sim.SWAMetadata,
    kind: str,
    num_rows: int | None,
    build: Callable[..., sparse_index.SparseIndexPair],
    *args: Any,
) -> sparse_index.SparseIndexPair:
    cache = swa.flashinfer_sparse_index_cache
    key = (kind, num_rows)
    pair = cache.get(key)
    if pair is None:
        pair = build(*args)
        if kind in sparse_index.CACHED_KINDS:
            cache[key] = pair
    return pair


#: how each ``floor:*`` variant gets the request index, then the layers' cache (a
#: variant of ``dsv4_sim``, or one of this benchmark's: "function", "decorator",
#: "call-through")
_PARTS: Final[dict[str, tuple[dsv4_sim.Variant, str]]] = {
    "floor:request-index": ("stepcache", "handwritten"),
    "floor:function": ("handwritten", "function"),
    "floor:decorator": ("handwritten", "decorator"),
    "floor:call-through": ("handwritten", "call-through"),
    "floor:stepcache": ("handwritten", "stepcache"),
}


class FloorBuilders(dsv4_sim.Builders):
    """The DSv4 builders, with the ``floor:*`` variants of this benchmark: the
    request index and the layers' cache as the variant says."""

    def request_index(
        self, meta: dsv4_sim.StepMetadata, buffer: torch.Tensor, variant: str
    ) -> torch.Tensor:
        parts = _PARTS.get(variant)
        how = cast(dsv4_sim.Variant, variant) if parts is None else parts[0]
        return super().request_index(meta, buffer, how)

    def layer_sparse_index(
        self, swa: dsv4_sim.SWAMetadata, kind: str, layer: int, variant: str
    ) -> sparse_index.SparseIndexPair:
        parts = _PARTS.get(variant)
        how = variant if parts is None else parts[1]
        build = self.build_sparse_indices
        if how == "function":
            return _function_sparse_index(swa, kind, None, build, swa, kind, layer)
        if how == "decorator":
            return _decorated_sparse_index(swa, kind, None, build, swa, kind, layer)
        if how == "call-through":
            return sparse_index.sparse_index(swa, kind, None, build, swa, kind, layer)
        return super().layer_sparse_index(swa, kind, layer, cast(dsv4_sim.Variant, how))


@attrs.frozen
class FloorPoint:
    tokens: int
    layers: int
    #: nanoseconds of each round's step, by label (the rounds in order)
    runs: dict[str, tuple[float, ...]] = attrs.field(repr=False)

    def ratio(self, label: str) -> float:
        """``label``'s step over the hand-written one, median over the rounds."""
        return paired_ratio(self.runs[label], self.runs["hand-written"])

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "layers": self.layers,
            "paired_ratios_to_hand_written": {
                label: self.ratio(label)
                for label in VARIANTS
                if label != "hand-written"
            },
        }


@attrs.frozen
class FloorResults:
    points: list[FloorPoint]
    rounds: int

    def to_dict(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "points": [p.to_dict() for p in self.points]}


def measure_point(tokens: int, layers: int, rounds: int) -> FloorPoint:
    """Time every variant at one point, after checking that they give the same values."""
    kinds = demo.layer_kinds(layers)
    lens = batch_layout(tokens)
    builders = FloorBuilders(max_tokens=max(tokens, 1))
    timed = [(label, cast(dsv4_sim.Variant, v)) for label, v in VARIANTS.items()]
    reference = demo.build_step(dsv4_sim.make_step(lens), builders, "uncached", kinds)
    for label, v in timed:
        result = demo.build_step(dsv4_sim.make_step(lens), builders, v, kinds)
        if not demo.same_result(result, reference):
            raise AssertionError(f"{label} differs from uncached at {tokens} tokens")
    rng = random.Random(f"floor {tokens} tokens {layers} layers")
    return FloorPoint(
        tokens, layers, time_rounds(builders, lens, kinds, timed, rounds, rng)
    )


def run(
    tokens: Sequence[int] = TOKENS,
    layers: Sequence[int] = LAYERS,
    rounds: int = ROUNDS,
) -> FloorResults:
    def measure(n_tokens: int, n_layers: int) -> FloorPoint:
        return measure_point(n_tokens, n_layers, rounds)

    return FloorResults(sweep("bench_floor", tokens, layers, measure), rounds)


def ratio_range(results: FloorResults, label: str) -> str:
    """The lowest and highest of ``label``'s ratios over the points, as text.

    >>> runs = {"hand-written": (10.0, 10.0), "x": (11.0, 11.0)}
    >>> ratio_range(FloorResults([FloorPoint(1, 8, runs)], 2), "x")
    '1.100x'
    """
    ratios = [p.ratio(label) for p in results.points]
    low, high = f"{min(ratios):.3f}x", f"{max(ratios):.3f}x"
    return low if low == high else f"{low}-{high}"


def render(results: FloorResults) -> str:
    labels = [label for label in VARIANTS if label != "hand-written"]
    header = ["layers", "tokens", *(f"{label} / hand-written" for label in labels)]
    rows = [
        [str(p.layers), str(p.tokens), *(f"{p.ratio(label):.3f}x" for label in labels)]
        for p in results.points
    ]
    return markdown_table(header, rows, "r" * len(header))


def main(argv: list[str] | None = None) -> None:
    main_with_rounds(
        __doc__,
        argv,
        ROUNDS,
        lambda rounds: run(rounds=rounds),
        lambda: run((1,), rounds=3),
        render,
    )


if __name__ == "__main__":
    main()
