# SPDX-License-Identifier: Apache-2.0
"""The cold path: a fresh owner's first call, and the request index per step.

Run: ``python -m benchmarks.bench_cold [--fast] [--rows TEXT] [--results PATH]`` (and
any other pyperf option). Every engine step makes new metadata objects, so the first
call on a fresh owner runs as often as any hit. pyperf times each benchmark in worker
processes of its own with the garbage collector on: what a cold call leaves for it to
walk is part of its cost. Each row's label says what both sides do; *stepcache* is
``@step_cached`` as shipped, the seeds' code is
:mod:`stepcache.integrations.dsv4.seed` (vLLM PR 47474, calling none of stepcache's
helpers). The request-index rows are first counted (copies into the index buffers per
step, the same on any machine) and checked to give the same rows.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import stepcache
from benchmarks import _pyperf
from benchmarks._pyperf import Prepare, Row, looped
from stepcache.integrations.dsv4 import request_index, seed

MODULE = "benchmarks.bench_cold"
RESULTS = _pyperf.ROOT / "build" / "benchmarks" / "cold.json"


# -- cold: an owner's first call -----------------------------------------------------
class Owner:
    """An owner of one step's tensor, with the same trivial function cached both ways."""

    def __init__(self, a: torch.Tensor, cache: int | None = None) -> None:
        self.a = a
        self._cache = cache

    @stepcache.step_cached(depends_on=("a",), name="bench_cold.first")
    def first(self) -> int:
        return 1

    @functools.cached_property
    def prop(self) -> int:
        return 1

    def threaded(self) -> int:
        """The hand-threaded cache: the value handed in, or computed once."""
        value = self._cache
        if value is None:
            value = self._cache = 1
        return value


class Kinds:
    """An owner of one step's tensor with a function keyed by a layer kind: DSv4's
    sparse-index cache, which a step's layers of two kinds ask for, each many times."""

    def __init__(self, a: torch.Tensor) -> None:
        self.a = a
        self.pairs: dict[str, int] = {}  # the seed's own cache: a dict in the owner

    @stepcache.step_cached(key="kind", depends_on=("a",), name="bench_cold.kinds")
    def pair(self, kind: str) -> int:
        return 1

    def by_hand(self, kind: str) -> int:
        """The seed's cache: the dict's entry, or computed once into it."""
        found = self.pairs.get(kind)
        if found is None:
            found = self.pairs[kind] = 1
        return found


def kinds_stepcache(t: torch.Tensor) -> None:
    owner = Kinds(t)
    for kind in ("swa_only", "c128a") * 2:
        owner.pair(kind)


def kinds_by_hand(t: torch.Tensor) -> None:
    owner = Kinds(t)
    for kind in ("swa_only", "c128a") * 2:
        owner.by_hand(kind)


def cold_stepcache(t: torch.Tensor) -> int:
    return Owner(t).first()


def cold_cached_property(t: torch.Tensor) -> int:
    return Owner(t).prop


def scope_stepcache(t: torch.Tensor) -> None:
    with stepcache.scope():
        for _ in range(6):
            owner = Owner(t)
            owner.first()
            owner.first()
            owner.first()


def scope_threaded(t: torch.Tensor) -> None:
    value = None
    for _ in range(6):
        owner = Owner(t, value)
        owner.threaded()
        owner.threaded()
        value = owner.threaded()


#: owners kept alive by the "1,000 owners alive" rows (in their worker)
_ALIVE: list[Owner] = []


def _tensor(inference: bool, *values: int) -> torch.Tensor:
    """A tensor made under ``torch.inference_mode()`` (as vLLM's step tensors) or not."""
    with torch.inference_mode(inference):
        return torch.tensor(values, dtype=torch.int32) if values else torch.zeros(4)


def _cold(
    step: Callable[[torch.Tensor], object], *, inference: bool = False, alive: int = 0
) -> Prepare:
    def prepare() -> _pyperf.TimeFunc:
        t = _tensor(inference)
        for _ in range(alive):
            owner = Owner(t)
            owner.first()
            _ = owner.prop
            _ALIVE.append(owner)
        return looped(step, t)

    return prepare


# -- the request index per step --------------------------------------------------------
#: 8 requests (one with no tokens), 10 tokens, padded to 16 as for a CUDA graph
LENS = (3, 1, 1, 0, 2, 1, 1, 1)
TOKENS = 16
GROUPS = 6


class Layout:
    """One step's layout tensors (inference tensors, as vLLM's, or version-counted)
    and the three consumers' persistent buffers (never inference tensors)."""

    def __init__(self, device: torch.device | str = "cpu", inference: bool = False):
        starts = [0]
        for n in LENS:
            starts.append(starts[-1] + n)
        self.query_start_loc_cpu = _tensor(inference, *starts)
        with torch.inference_mode(inference):
            self.query_start_loc = self.query_start_loc_cpu.to(device, copy=True)
        self.buffers = [
            torch.zeros(64, dtype=torch.int32, device=device) for _ in range(3)
        ]

    def metadata(self, cache: torch.Tensor | None = None) -> seed.SeedMetadata:
        """A fresh metadata object of the step."""
        return seed.SeedMetadata(
            self.query_start_loc, self.query_start_loc_cpu, TOKENS, cache
        )


#: the variants of the request-index rows
VARIANTS = ("stepcache", "hand-written", "uncached")
Index = Callable[[seed.SeedMetadata, torch.Tensor], torch.Tensor]
_INDEX: dict[str, Index] = {
    "stepcache": request_index.token_to_req_indices,
    "hand-written": seed.handwritten_token_to_req_indices,
    "uncached": seed.uncached_token_to_req_indices,
}
Step = Callable[[Layout], list[torch.Tensor]]


def three_consumers(variant: str) -> Step:
    """One step: a fresh metadata object, its three consumers ask for the index."""
    index = _INDEX[variant]

    def step(layout: Layout) -> list[torch.Tensor]:
        meta = layout.metadata()
        return [index(meta, buffer) for buffer in layout.buffers]

    return step


def six_groups(variant: str) -> Step:
    """One step in V2's shape: a metadata object per group, one consumer each;
    stepcache inside a scope, the seed's slot handed from group to group."""
    index = _INDEX[variant]

    def step(layout: Layout) -> list[torch.Tensor]:
        out, cache = [], None
        with stepcache.scope() if variant == "stepcache" else contextlib.nullcontext():
            for i in range(GROUPS):
                meta = layout.metadata(cache)
                out.append(index(meta, layout.buffers[i % 3]))
                if variant == "hand-written":
                    cache = meta._token_to_req_indices_cache
        return out

    return step


#: the request-index shapes: one step of each
SHAPES: dict[str, Callable[[str], Step]] = {
    "three consumers": three_consumers,
    "six groups": six_groups,
}


def _step_bench(shape: str, variant: str, inference: bool = False) -> Prepare:
    def prepare() -> _pyperf.TimeFunc:
        return looped(SHAPES[shape](variant), Layout(inference=inference))

    return prepare


class CopyCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the copies between the host and ``device_type`` tensors made while it is
    active, and how many of the host-to-device ones write into ``targets`` (tensors
    that are the destination or whose view is: the request-index buffers).

    >>> buffer = torch.empty(4, dtype=torch.int32, device="meta")
    >>> with CopyCounter([buffer], device_type="meta") as counter:
    ...     _ = buffer[:2].copy_(torch.arange(2, dtype=torch.int32))
    ...     _ = torch.ones(3).to("meta")
    >>> counter.h2d, counter.h2d_into_targets, counter.d2h
    (2, 1, 0)
    """

    def __init__(self, targets: Sequence[torch.Tensor] = (), device_type: str = "cuda"):
        super().__init__()  # type: ignore[no-untyped-call]
        self.device_type = device_type
        self._targets = list(targets)  # kept alive: they are matched by id
        self.h2d = 0
        self.h2d_into_targets = 0
        self.d2h = 0
        self.scalar_reads = 0

    def _on(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == self.device_type

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            if self._on(dst) and src.device.type == "cpu":
                self.h2d += 1
                base = dst if dst._base is None else dst._base
                if any(base is t for t in self._targets):
                    self.h2d_into_targets += 1
            elif self._on(src) and dst.device.type == "cpu":
                self.d2h += 1
        elif func is torch.ops.aten._to_copy.default:
            src, device = args[0], kwargs.get("device")
            dst_type = None if device is None else torch.device(device).type
            if src.device.type == "cpu" and dst_type == self.device_type:
                self.h2d += 1
            elif self._on(src) and dst_type == "cpu":
                self.d2h += 1
        elif func is torch.ops.aten._local_scalar_dense.default and self._on(args[0]):
            self.scalar_reads += 1
        return func(*args, **kwargs)


def work_per_step() -> dict[str, Any]:
    """Copies into the index buffers in one step, by shape and variant; raises if a
    variant's rows differ from the uncached ones."""
    out: dict[str, dict[str, int]] = {}
    for shape, make in SHAPES.items():
        expected, out[shape] = None, {}
        for variant in VARIANTS:
            layout = Layout()
            with CopyCounter(layout.buffers, device_type="cpu") as counter:
                rows = [r.tolist() for r in make(variant)(layout)]
            expected = expected or rows
            if rows != expected:
                raise AssertionError(f"{shape}, {variant}: rows {rows} != {expected}")
            out[shape][variant] = counter.h2d_into_targets
    return {"work_per_step": out}


# -- the rows ----------------------------------------------------------------------------
BENCHES: dict[str, Prepare] = {
    "cold/stepcache": _cold(cold_stepcache),
    "cold/cached_property": _cold(cold_cached_property),
    "cold inference/stepcache": _cold(cold_stepcache, inference=True),
    "cold inference/cached_property": _cold(cold_cached_property, inference=True),
    "cold 1000 alive/stepcache": _cold(cold_stepcache, alive=1000),
    "cold 1000 alive/cached_property": _cold(cold_cached_property, alive=1000),
    "two kinds/stepcache": _cold(kinds_stepcache),
    "two kinds/dict in the owner": _cold(kinds_by_hand),
    "scope 6x3/stepcache": _cold(scope_stepcache, inference=True),
    "scope 6x3/hand-threaded": _cold(scope_threaded, inference=True),
    **{
        f"request index {shape}/{v}": _step_bench(shape, v)
        for shape in SHAPES
        for v in VARIANTS
    },
    **{
        f"request index three consumers inference/{v}": _step_bench(
            "three consumers", v, inference=True
        )
        for v in VARIANTS[:2]
    },
}

_COLD = "make an owner, call once, drop it (one {} dependency, `return 1`)"
_RIX = "request index per step ({}), 8 requests padded to 16 tokens"
_SEED = "the seed's hand-written method (PR 47474)"
# fmt: off
ROWS = [
    Row("cold", _COLD.format("version-counted tensor") + ": stepcache / "
        "`functools.cached_property`'s first access", "cold/stepcache",
        "cold/cached_property", 1.7, "issue 56"),
    Row("cold inference", _COLD.format("inference tensor") + ": stepcache / "
        "`functools.cached_property`'s first access", "cold inference/stepcache",
        "cold inference/cached_property", 2.0, "issue 56"),
    Row("cold 1000 alive", _COLD.format("version-counted tensor") + ", 1,000 owners "
        "alive: stepcache / `functools.cached_property`", "cold 1000 alive/stepcache",
        "cold 1000 alive/cached_property", 2.0, "issue 56"),
    Row("two kinds", "make an owner, ask a function keyed by layer kind for two kinds, "
        "twice each, drop it (one version-counted tensor dependency, `return 1`; "
        "DSv4's sparse-index shape): stepcache / a dict in the owner (the seed's "
        "cache)", "two kinds/stepcache", "two kinds/dict in the owner", 2.0, "issue 56"),
    Row("scope 6x3", "six owners of one layout (inference tensor), three calls each: "
        "stepcache inside a scope / hand-threaded (the first owner computes, the others "
        "are handed its value)", "scope 6x3/stepcache", "scope 6x3/hand-threaded", 3.0,
        "issue 56"),
    Row("rix three consumers", _RIX.format("three consumers of one fresh metadata "
        "object") + f": stepcache / {_SEED}", "request index three consumers/stepcache",
        "request index three consumers/hand-written", 1.0, "issue 56"),
    Row("rix three consumers inference", _RIX.format("three consumers, a layout of "
        "inference tensors") + f": stepcache / {_SEED}",
        "request index three consumers inference/stepcache",
        "request index three consumers inference/hand-written"),
    Row("rix three consumers uncached", _RIX.format("three consumers") + ": uncached "
        f"(vLLM before PR 47474: each consumer computes and copies) / {_SEED}",
        "request index three consumers/uncached",
        "request index three consumers/hand-written"),
    Row("rix six groups", _RIX.format("V2's six groups, a metadata object each") + ": "
        "stepcache inside a scope / hand-threading the seed's slot from group to group",
        "request index six groups/stepcache", "request index six groups/hand-written",
        1.25, "issue 43"),
    Row("rix six groups uncached", _RIX.format("six groups") + ": uncached / "
        "hand-threading the seed's slot", "request index six groups/uncached",
        "request index six groups/hand-written"),
]
# fmt: on


def main(argv: Sequence[str] | None = None) -> int:
    return _pyperf.main(
        MODULE,
        BENCHES,
        ROWS,
        processes=6,
        values=3,
        results=RESULTS,
        argv=argv,
        extra=work_per_step,
    )


if __name__ == "__main__":
    sys.exit(main())
