# SPDX-License-Identifier: Apache-2.0
"""An engine-free model of one DeepSeek V4 step: three metadata builders, L layers.

It reproduces the shape of the work vLLM does for DSv4 with small CPU (or CUDA)
tensors, in three variants that must give identical results:

* ``"uncached"``: every builder computes the request index itself and every layer
  builds its sparse indices (what vLLM did before the two seed PRs; the request
  index is :func:`.seed.uncached_token_to_req_indices`, the seeds' own code);
* ``"handwritten"``: the seed PRs' caches, a ``_token_to_req_indices_cache`` slot on
  the step metadata (:func:`.seed.handwritten_token_to_req_indices`, PR 47474's
  method as merged) and a ``flashinfer_sparse_index_cache`` dict on the SWA metadata
  (including their flaw: a reassigned layout keeps the old index);
* ``"stepcache"``: :func:`~stepcache.integrations.dsv4.request_index.token_to_req_indices`
  for the builders, and for the layers the sparse-index build decorated with
  :func:`~stepcache.integrations.dsv4.sparse_index.sparse_index_builder`
  (:attr:`Builders.cached_sparse_indices`), as a model's own code would use it.

The API is :func:`make_step` (one step's layout), :class:`Builders` (persistent
buffers, as an engine keeps them) and :func:`run_step`; :func:`main` is
``python -m stepcache demo``.

>>> builders = Builders(max_tokens=32)
>>> meta = make_step([3, 0, 1], pad_to=6)
>>> result = run_step(meta, builders, "stepcache", layers=("swa_only", "c4a", "c128a"))
>>> result.index.tolist()
[0, 0, 0, 2, 0, 0]
>>> result.index_computations, result.sparse_builds
(1, 3)
>>> run_step(make_step([3, 0, 1], pad_to=6), builders, "uncached",
...          layers=("swa_only", "c4a", "c128a")).index_computations
3
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import torch

import stepcache

from . import request_index, seed, sparse_index

__all__ = [
    "DSV4_LAYERS",
    "SPARSE_NAME",
    "VARIANTS",
    "Builders",
    "StepMetadata",
    "StepResult",
    "SWAMetadata",
    "Variant",
    "build_step",
    "main",
    "make_step",
    "run_step",
    "sparse_pair",
]

Variant = Literal["uncached", "handwritten", "stepcache"]
VARIANTS: Final[tuple[Variant, ...]] = ("uncached", "handwritten", "stepcache")

#: A DSv4-like layer pattern: SWA-only layers first, then C4A and C128A alternating.
DSV4_LAYERS: Final[tuple[str, ...]] = ("swa_only", "swa_only") + ("c4a", "c128a") * 4

_INDEX_NAME = "dsv4.token_to_req_indices"
#: the stats label of :attr:`Builders.cached_sparse_indices`
SPARSE_NAME: Final = "dsv4_sim.sparse_indices"


@dataclasses.dataclass
class StepMetadata:
    """One step's batch layout, the part of vLLM's ``CommonAttentionMetadata`` the
    DSv4 builders read."""

    query_start_loc: torch.Tensor
    query_start_loc_cpu: torch.Tensor
    #: ``(num_reqs,)`` tokens of each request after this step (context + query)
    seq_lens: torch.Tensor
    num_reqs: int
    #: tokens the step runs, padding included
    num_actual_tokens: int
    #: the hand-written cache of the ``"handwritten"`` variant (the seed PR's slot)
    _token_to_req_indices_cache: torch.Tensor | None = None


@dataclasses.dataclass
class SWAMetadata:
    """What the sparse-SWA builder hands to every layer of the step."""

    token_to_req_indices: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    num_mapped_tokens: int
    num_actual_tokens: int
    num_decode_tokens: int
    #: the hand-written cache of the ``"handwritten"`` variant (the seed PR's dict)
    flashinfer_sparse_index_cache: dict[
        tuple[str, int | None], sparse_index.SparseIndexPair
    ] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StepResult:
    """What one step produced, and how much work it took."""

    #: the request index each builder received (sparse-MLA, compressor, sparse-SWA)
    indices: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    #: the compressor builder's token positions
    positions: torch.Tensor
    #: each layer's ``(sparse_indices, sparse_topk_lens)``
    sparse: list[sparse_index.SparseIndexPair]
    #: how many times the request index was computed this step
    index_computations: int
    #: how many times a layer's sparse indices were built this step
    sparse_builds: int

    @property
    def index(self) -> torch.Tensor:
        """The request index (the sparse-MLA builder's copy)."""
        return self.indices[0]


def make_step(
    query_lens: Sequence[int],
    context_lens: Sequence[int] | None = None,
    *,
    pad_to: int | None = None,
    device: torch.device | str = "cpu",
) -> StepMetadata:
    """The layout of a step whose requests run ``query_lens`` tokens each (0 allowed)
    after ``context_lens`` tokens of context (default: 8 each), padded to ``pad_to``
    tokens (default: no padding).

    >>> make_step([2, 1], pad_to=4).query_start_loc.tolist()
    [0, 2, 3]
    """
    lens = [int(n) for n in query_lens]
    if any(n < 0 for n in lens):
        raise ValueError(f"query_lens must be >= 0 (got {lens})")
    ctx = [8] * len(lens) if context_lens is None else [int(c) for c in context_lens]
    if len(ctx) != len(lens):
        raise ValueError(
            f"context_lens has {len(ctx)} entries, query_lens {len(lens)}: "
            "give one context length per request"
        )
    qsl = torch.zeros(len(lens) + 1, dtype=torch.int32)
    if lens:
        qsl[1:] = torch.tensor(np.cumsum(lens), dtype=torch.int32)
    total = int(qsl[-1])
    padded = total if pad_to is None else pad_to
    if padded < total:
        raise ValueError(f"pad_to={pad_to} is below the {total} tokens of the step")
    seq_lens = torch.tensor(
        [c + n for c, n in zip(ctx, lens, strict=True)], dtype=torch.int32
    )
    return StepMetadata(
        query_start_loc=qsl.to(device),
        query_start_loc_cpu=qsl,
        seq_lens=seq_lens.to(device),
        num_reqs=len(lens),
        num_actual_tokens=padded,
    )


class Builders:
    """The three DSv4 metadata builders, with their persistent buffers.

    ``window`` is the sliding window, ``topk`` the compressed top-k width of the
    sparse indices.
    """

    def __init__(
        self,
        max_tokens: int,
        *,
        device: torch.device | str = "cpu",
        window: int = 8,
        topk: int = 4,
    ) -> None:
        self.device = torch.device(device)
        self.window = window
        self.topk = topk
        self.sparse_mla_buffer = torch.zeros(
            max_tokens, dtype=torch.int32, device=self.device
        )
        self.compressor_buffer = torch.zeros_like(self.sparse_mla_buffer)
        self.swa_buffer = torch.zeros_like(self.sparse_mla_buffer)
        self.index_computations = 0
        self.sparse_builds = 0

    # -- the request index, three ways -------------------------------------------------
    # The two baselines are the seeds' own code (:mod:`.seed`), not stepcache's helpers.
    def _computed_index(self, meta: StepMetadata, buffer: torch.Tensor) -> torch.Tensor:
        self.index_computations += 1
        return seed.uncached_token_to_req_indices(meta, buffer)

    def _handwritten_index(
        self, meta: StepMetadata, buffer: torch.Tensor
    ) -> torch.Tensor:
        # The seed PR's cache: the first caller fills the slot, every later caller of
        # the object gets it, whatever happened to the layout since.
        if meta._token_to_req_indices_cache is None:  # noqa: SLF001 (vLLM's name)
            self.index_computations += 1
        return seed.handwritten_token_to_req_indices(meta, buffer)

    def request_index(
        self, meta: StepMetadata, buffer: torch.Tensor, variant: Variant
    ) -> torch.Tensor:
        """The request index as ``variant`` gets it into ``buffer``."""
        if variant == "uncached":
            return self._computed_index(meta, buffer)
        if variant == "handwritten":
            return self._handwritten_index(meta, buffer)
        if variant == "stepcache":
            return request_index.token_to_req_indices(meta, buffer)
        raise ValueError(f"variant must be one of {VARIANTS} (got {variant!r})")

    # -- the three builders ------------------------------------------------------------
    def build_sparse_mla(self, meta: StepMetadata, variant: Variant) -> torch.Tensor:
        """The sparse-MLA builder's ``req_id_per_token``."""
        return self.request_index(meta, self.sparse_mla_buffer, variant)

    def build_compressor(
        self, meta: StepMetadata, variant: Variant
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The compressor builder's request index and each token's position."""
        index = self.request_index(meta, self.compressor_buffer, variant)
        return index, _positions(meta, index)

    def build_swa(self, meta: StepMetadata, variant: Variant) -> SWAMetadata:
        """The sparse-SWA builder's metadata, shared by every layer of the step."""
        index = self.request_index(meta, self.swa_buffer, variant)
        lens = meta.query_start_loc_cpu.diff()
        decodes = lens <= 1
        num_decode_reqs = (
            int(lens.numel())
            if bool(decodes.all())
            else int(torch.argmin(decodes.int()))
        )
        return SWAMetadata(
            token_to_req_indices=index,
            query_start_loc=meta.query_start_loc,
            seq_lens=meta.seq_lens,
            num_mapped_tokens=int(meta.query_start_loc_cpu[-1]),
            num_actual_tokens=meta.num_actual_tokens,
            num_decode_tokens=int(meta.query_start_loc_cpu[num_decode_reqs]),
        )

    # -- the layers --------------------------------------------------------------------
    def build_sparse_indices(
        self, swa: SWAMetadata, kind: str, layer: int
    ) -> sparse_index.SparseIndexPair:
        """One layer's ``(sparse_indices, sparse_topk_lens)`` (:func:`sparse_pair`),
        counted in :attr:`sparse_builds`."""
        self.sparse_builds += 1
        return sparse_pair(
            swa, kind, layer, window=self.window, topk=self.topk, device=self.device
        )

    #: :meth:`build_sparse_indices` with stepcache's sparse-index cache, the builder
    #: decorated as a model's own code would decorate it: one build per step for each
    #: kind of the SWA-only and C128A layers (the seed's key, whose row count is
    #: always ``None`` here), every call for C4A.
    cached_sparse_indices = sparse_index.sparse_index_builder(
        owner="swa", num_rows=None, name=SPARSE_NAME
    )(build_sparse_indices)

    def layer_sparse_index(
        self, swa: SWAMetadata, kind: str, layer: int, variant: Variant
    ) -> sparse_index.SparseIndexPair:
        """Layer ``layer``'s sparse indices as ``variant`` gets them."""
        if variant == "uncached":
            return self.build_sparse_indices(swa, kind, layer)
        if variant == "handwritten":
            key = (kind, None)
            cached = swa.flashinfer_sparse_index_cache.get(key)
            if cached is not None:
                return cached
            pair = self.build_sparse_indices(swa, kind, layer)
            if kind in sparse_index.CACHED_KINDS:
                swa.flashinfer_sparse_index_cache[key] = pair
            return pair
        if variant == "stepcache":
            return self.cached_sparse_indices(swa, kind, layer)
        raise ValueError(f"variant must be one of {VARIANTS} (got {variant!r})")


def _positions(meta: StepMetadata, index: torch.Tensor) -> torch.Tensor:
    """Each token's position in its request's sequence (0 on padding rows)."""
    n = meta.num_actual_tokens
    if meta.num_reqs == 0:
        return torch.zeros(n, dtype=torch.int64, device=index.device)
    idx = index[:n].long()
    qsl = meta.query_start_loc.long()
    start = meta.seq_lens.long()[idx] - (qsl[idx + 1] - qsl[idx])
    pos = start + torch.arange(n, device=index.device) - qsl[idx]
    real = torch.arange(n, device=index.device) < int(meta.query_start_loc_cpu[-1])
    return torch.where(real, pos, 0)


def sparse_pair(
    swa: SWAMetadata,
    kind: str,
    layer: int,
    *,
    window: int,
    topk: int,
    device: torch.device,
) -> sparse_index.SparseIndexPair:
    """Layer ``layer``'s ``(sparse_indices, sparse_topk_lens)``: the sliding window of
    ``window`` positions of every token, then ``topk`` compressed entries (C4A layers
    pick theirs per layer, so they differ from layer to layer), on ``device``."""
    n = swa.num_actual_tokens
    index = swa.token_to_req_indices[:n].long()
    real = torch.arange(n, device=device) < swa.num_mapped_tokens
    qsl = swa.query_start_loc.long()
    seq_lens = swa.seq_lens.long()
    if seq_lens.numel():
        start = seq_lens[index] - (qsl[index + 1] - qsl[index])
        pos = start + torch.arange(n, device=device) - qsl[index]
    else:
        pos = torch.zeros(n, dtype=torch.long, device=device)
    columns = [pos[:, None] - torch.arange(window, device=device)]
    if kind != "swa_only":
        ratio = 128 if kind == "c128a" else 4
        step = 1 if kind == "c128a" else layer + 1
        columns.append(pos[:, None] // ratio - step * torch.arange(topk, device=device))
    indices = torch.cat(columns, dim=1)
    indices = torch.where((indices >= 0) & real[:, None], indices, -1)
    lens = (indices >= 0).sum(dim=1)
    return indices.to(torch.int32), lens.to(torch.int32)


def build_step(
    meta: StepMetadata,
    builders: Builders,
    variant: Variant,
    layers: Sequence[str] = DSV4_LAYERS,
) -> StepResult:
    """The metadata build of one step, for timing: the three builders, then
    ``layers`` (their kinds, in order).

    ``index_computations`` counts the uncached and hand-written variants' computations
    (0 for stepcache, whose count :func:`run_step` reads from the step's cache).
    """
    index_before = builders.index_computations
    builds_before = builders.sparse_builds
    mla_index = builders.build_sparse_mla(meta, variant)
    compressor_index, positions = builders.build_compressor(meta, variant)
    swa = builders.build_swa(meta, variant)
    sparse = [
        builders.layer_sparse_index(swa, kind, i, variant)
        for i, kind in enumerate(layers)
    ]
    return StepResult(
        indices=(mla_index, compressor_index, swa.token_to_req_indices),
        positions=positions,
        sparse=sparse,
        index_computations=builders.index_computations - index_before,
        sparse_builds=builders.sparse_builds - builds_before,
    )


def run_step(
    meta: StepMetadata,
    builders: Builders,
    variant: Variant,
    layers: Sequence[str] = DSV4_LAYERS,
) -> StepResult:
    """Run one step: the three builders, then ``layers`` (their kinds, in order)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS} (got {variant!r})")
    misses_before = _index_misses(meta)
    result = build_step(meta, builders, variant, layers)
    if variant == "stepcache":
        computed = _index_misses(meta) - misses_before
        result = dataclasses.replace(result, index_computations=computed)
    return result


def _index_misses(meta: StepMetadata) -> int:
    entry = stepcache.cache_of(meta).stats().get(_INDEX_NAME)
    return 0 if entry is None else entry["misses"]


# -- python -m stepcache demo ------------------------------------------------------------
def _mixed_steps(steps: int, seed: int) -> list[tuple[list[int], int | None]]:
    """``steps`` (query lengths, padding) of a serving mix: padded decode batches, and
    decodes beside one or two chunked prefills, some requests with no tokens."""
    rng = random.Random(seed)
    out: list[tuple[list[int], int | None]] = []
    for _ in range(steps):
        if rng.random() < 0.6:
            lens = [1] * rng.randint(1, 48)
            out.append((lens, 1 << (len(lens) - 1).bit_length()))  # a graph size
        else:
            lens = [1] * rng.randint(0, 16) + [rng.randint(8, 96) for _ in range(2)]
            lens.insert(rng.randrange(len(lens) + 1), 0)
            out.append((lens, None))
    return out


def _same(a: StepResult, b: StepResult) -> bool:
    pairs = [*zip(a.indices, b.indices, strict=True), (a.positions, b.positions)]
    for x, y in zip(a.sparse, b.sparse, strict=True):
        pairs += list(zip(x, y, strict=True))
    return all(torch.equal(x, y) for x, y in pairs)


def _count(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {text})")
    return int(text)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stepcache demo``: seeded DSv4 steps through every variant, checked
    to agree; prints each variant's work per step and ``stepcache.stats()``."""
    parser = argparse.ArgumentParser(
        prog="python -m stepcache demo",
        description="Simulated DeepSeek V4 steps on the CPU: uncached, the seed PRs' "
        "hand-written caches, and stepcache.",
    )
    parser.add_argument("--steps", type=_count, default=20, help="steps (default 20)")
    parser.add_argument(
        "--layers", type=_count, default=len(DSV4_LAYERS), help="layers per step"
    )
    parser.add_argument("--seed", type=int, default=0, help="the workload's seed")
    args = parser.parse_args(argv)
    layers = (DSV4_LAYERS[:2] + ("c4a", "c128a") * args.layers)[: args.layers]
    plans = _mixed_steps(args.steps, args.seed)
    most = max(pad or sum(lens) for lens, pad in plans)
    builders = {v: Builders(max_tokens=most) for v in VARIANTS}
    work = {v: [0, 0, 0] for v in VARIANTS}  # index computations, sparse builds, ns
    stepcache.reset_stats()
    for i, (lens, pad) in enumerate(plans):
        results = {}
        for v in VARIANTS[i % 3 :] + VARIANTS[: i % 3]:  # no variant always first
            meta = make_step(lens, pad_to=pad)
            start = time.perf_counter_ns()
            results[v] = result = run_step(meta, builders[v], v, layers)
            work[v][2] += time.perf_counter_ns() - start
            work[v][0] += result.index_computations
            work[v][1] += result.sparse_builds
        wrong = [v for v in VARIANTS if not _same(results[v], results["uncached"])]
        if wrong:
            print(
                f"step {i + 1}: {', '.join(wrong)} differ from uncached",
                file=sys.stderr,
            )
            return 1
    n = args.steps
    print(
        f"stepcache demo: {n} simulated DeepSeek V4 steps (seed {args.seed}), "
        f"{len(layers)} layers, on the CPU\n"
    )
    print(
        f"{'variant':<12} {'request index':>14} {'sparse builds':>14} {'wall time':>10}"
    )
    print(f"{'':<12} {'per step':>14} {'per step':>14} {'per step':>10}")
    for v in VARIANTS:
        index, sparse, ns = work[v]
        print(f"{v:<12} {index / n:>14.1f} {sparse / n:>14.1f} {ns / n / 1e6:>7.2f} ms")
    print("\nEvery variant gave the uncached results in every step.\n")
    print(f"stepcache.stats():\n{stepcache.stats()}\n")
    print("The full demo (a draft loop, debug mode, vLLM): bash scripts/demo.sh")
    print("in the stepcache repository.")
    return 0
