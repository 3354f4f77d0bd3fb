# SPDX-License-Identifier: Apache-2.0
"""The cold path: a fresh owner's first call, and the request index per step.

Run: ``python -m benchmarks.bench_cold [--fast] [--results PATH] [--rows TEXT]`` (and
any other ``pyperf`` option: ``-p`` processes, ``-n`` values per process, ...).
Every engine step makes new metadata objects, so the first call on a fresh owner
runs as often as any hit. Each row compares two benchmarks of one pyperf run: pyperf
times each in worker processes of its own (loops calibrated, one warm-up, then
values), the two sides of a row one after the other; a row is the ratio of their
medians, with the significance test of ``pyperf compare_to``. The garbage collector
stays on: what a cold call leaves for it to walk is part of its cost.

Rows, each saying what both sides do:

* *cold*: make an owner holding one tensor, call a trivial function (``return 1``)
  that depends on it once, drop the owner; stepcache's ``@step_cached`` against
  ``functools.cached_property``'s first access timed the same way. The tensor has a
  version counter, or is an inference tensor (made under
  ``torch.inference_mode()``), or 1,000 owners that were called once are alive.
* *two kinds*: make an owner, ask a function keyed by layer kind for two kinds twice
  each (the second kind is a new key on the store the first made), drop it, against
  the seed's own cache (a dict in the owner).
* *scope*: six owners of one layout inside ``stepcache.scope()``, three calls each,
  against the hand-threaded code of vLLM's Model Runner V2 (``build_attn_metadata``
  hands the first group's ``_token_to_req_indices_cache`` to the next group's
  metadata): the first owner computes, the others are handed its value.
* *request index per step*: a fresh CPU metadata object per step (a batch of 8
  requests padded to 16 tokens), its three consumers (each with its own int32
  buffer) asking for ``token_to_req_indices``: stepcache's
  (:mod:`stepcache.integrations.dsv4.request_index`) against the seeds' code
  (:mod:`stepcache.integrations.dsv4.seed`): PR 47474's hand-written method, and
  uncached (every consumer computes and copies). Then V2's six-group shape: six
  metadata objects of one layout per step, one consumer each; stepcache inside a
  scope against hand-threading the seed's slot from group to group.

The request-index rows are counted before they are timed (copies into the index
buffers per step, the same on any machine) and checked to give the same rows.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import stepcache
from benchmarks import _pyperf
from benchmarks._pyperf import Bench, Row
from benchmarks._report import markdown_table
from stepcache.integrations.dsv4 import request_index, seed

ROOT = Path(__file__).resolve().parents[1]
MODULE = "benchmarks.bench_cold"
RESULTS = ROOT / "docs" / "benchmarks" / "cold.json"
#: worker processes per benchmark (``--fast``: 3), values per process
PROCESSES, VALUES = 6, 3


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
    for kind in ("swa_only", "c128a", "swa_only", "c128a"):
        owner.pair(kind)


def kinds_by_hand(t: torch.Tensor) -> None:
    owner = Kinds(t)
    for kind in ("swa_only", "c128a", "swa_only", "c128a"):
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


def _tensor(inference: bool) -> torch.Tensor:
    if inference:
        with torch.inference_mode():
            return torch.zeros(4)
    return torch.zeros(4)


def _looped(step: Callable[[Any], object], arg: Any) -> Callable[[int], float]:
    def time_func(loops: int) -> float:
        start = time.perf_counter()
        for _ in range(loops):
            step(arg)
        return time.perf_counter() - start

    return time_func


def _cold(
    step: Callable[[torch.Tensor], object], *, inference: bool = False, alive: int = 0
) -> Callable[[], Callable[[int], float]]:
    def prepare() -> Callable[[int], float]:
        t = _tensor(inference)
        for _ in range(alive):
            owner = Owner(t)
            owner.first()
            _ = owner.prop
            _ALIVE.append(owner)
        return _looped(step, t)

    return prepare


# -- the request index per step --------------------------------------------------------
#: 8 requests (one with no tokens), 10 tokens, padded to 16 as for a CUDA graph
LENS = (3, 1, 1, 0, 2, 1, 1, 1)
TOKENS = 16
GROUPS = 6


class Layout:
    """One step's layout tensors and the three consumers' persistent buffers."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        starts = [0]
        for n in LENS:
            starts.append(starts[-1] + n)
        self.query_start_loc_cpu = torch.tensor(starts, dtype=torch.int32)
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
#: the request-index shapes: one step of each
SHAPES: dict[str, Callable[[str], Callable[[Layout], list[torch.Tensor]]]] = {}


def three_consumers(variant: str) -> Callable[[Layout], list[torch.Tensor]]:
    """One step: a fresh metadata object, its three consumers ask for the index."""
    index = _INDEX[variant]

    def step(layout: Layout) -> list[torch.Tensor]:
        meta = layout.metadata()
        return [index(meta, buffer) for buffer in layout.buffers]

    return step


def six_groups(variant: str) -> Callable[[Layout], list[torch.Tensor]]:
    """One step in V2's shape: a metadata object per group, one consumer each;
    stepcache inside a scope, the seed's slot handed from group to group."""
    index = _INDEX[variant]
    buffers = range(GROUPS)

    def scoped(layout: Layout) -> list[torch.Tensor]:
        with stepcache.scope():
            return [index(layout.metadata(), layout.buffers[i % 3]) for i in buffers]

    def threaded(layout: Layout) -> list[torch.Tensor]:
        out, cache = [], None
        for i in buffers:
            meta = layout.metadata(cache)
            out.append(index(meta, layout.buffers[i % 3]))
            cache = meta._token_to_req_indices_cache
        return out

    def uncached(layout: Layout) -> list[torch.Tensor]:
        return [index(layout.metadata(), layout.buffers[i % 3]) for i in buffers]

    return {"stepcache": scoped, "hand-written": threaded, "uncached": uncached}[
        variant
    ]


SHAPES.update({"three consumers": three_consumers, "six groups": six_groups})


def _step_bench(
    make: Callable[[str], Callable[[Layout], object]], variant: str
) -> Callable[[], Callable[[int], float]]:
    def prepare() -> Callable[[int], float]:
        return _looped(make(variant), Layout())

    return prepare


class _BufferCopies(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts ``copy_`` calls that write into views of ``buffers``."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._buffers = list(buffers)
        self.copies = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if func is torch.ops.aten.copy_.default:
            dst = args[0]
            base = dst if dst._base is None else dst._base
            self.copies += any(base is b for b in self._buffers)
        return func(*args, **(kwargs or {}))


def work_per_step() -> dict[str, dict[str, int]]:
    """Copies into the index buffers in one step, by shape and variant; raises if a
    variant's rows differ from the uncached ones."""
    out: dict[str, dict[str, int]] = {}
    for shape, make in SHAPES.items():
        expected = None
        out[shape] = {}
        for variant in VARIANTS:
            layout = Layout()
            with _BufferCopies(layout.buffers) as counter:
                rows = [r.tolist() for r in make(variant)(layout)]
            expected = expected or rows
            if rows != expected:
                raise AssertionError(f"{shape}, {variant}: rows {rows} != {expected}")
            out[shape][variant] = counter.copies
    return out


# -- the rows ----------------------------------------------------------------------------
BENCHES: dict[str, Bench] = {
    b.name: b
    for b in [
        Bench("cold/stepcache", _cold(cold_stepcache)),
        Bench("cold/cached_property", _cold(cold_cached_property)),
        Bench("cold inference/stepcache", _cold(cold_stepcache, inference=True)),
        Bench(
            "cold inference/cached_property",
            _cold(cold_cached_property, inference=True),
        ),
        Bench("cold 1000 alive/stepcache", _cold(cold_stepcache, alive=1000)),
        Bench(
            "cold 1000 alive/cached_property", _cold(cold_cached_property, alive=1000)
        ),
        Bench("two kinds/stepcache", _cold(kinds_stepcache)),
        Bench("two kinds/dict in the owner", _cold(kinds_by_hand)),
        Bench("scope 6x3/stepcache", _cold(scope_stepcache, inference=True)),
        Bench("scope 6x3/hand-threaded", _cold(scope_threaded, inference=True)),
        *(
            Bench(f"request index 3 consumers/{v}", _step_bench(three_consumers, v))
            for v in VARIANTS
        ),
        *(
            Bench(f"request index 6 groups/{v}", _step_bench(six_groups, v))
            for v in VARIANTS
        ),
    ]
}

_COLD = "make an owner, call once, drop it (one {} dependency, `return 1`)"
ROWS = [
    Row(
        _COLD.format("version-counted tensor")
        + ": stepcache / `functools.cached_property`'s first access",
        "cold/stepcache",
        "cold/cached_property",
        1.7,
        "issue 56",
    ),
    Row(
        _COLD.format("inference tensor")
        + ": stepcache / `functools.cached_property`'s first access",
        "cold inference/stepcache",
        "cold inference/cached_property",
        2.0,
        "issue 56",
    ),
    Row(
        _COLD.format("version-counted tensor")
        + ", 1,000 owners alive: stepcache / `functools.cached_property`",
        "cold 1000 alive/stepcache",
        "cold 1000 alive/cached_property",
        2.0,
        "issue 56",
    ),
    Row(
        "make an owner, ask a function keyed by layer kind for two kinds, twice each, "
        "drop it (one version-counted tensor dependency, `return 1`; DSv4's sparse-index "
        "shape): stepcache / a dict in the owner (the seed's cache)",
        "two kinds/stepcache",
        "two kinds/dict in the owner",
        2.0,
        "issue 56",
    ),
    Row(
        "six owners of one layout (inference tensor), three calls each: stepcache "
        "inside a scope / hand-threaded (the first owner computes, the others are "
        "handed its value)",
        "scope 6x3/stepcache",
        "scope 6x3/hand-threaded",
        3.0,
        "issue 56",
    ),
    Row(
        "request index per step, three consumers of one fresh metadata object: "
        "stepcache / the seed's hand-written method (PR 47474)",
        "request index 3 consumers/stepcache",
        "request index 3 consumers/hand-written",
        1.0,
        "issue 56",
    ),
    Row(
        "request index per step, three consumers: uncached (vLLM before PR 47474: "
        "each computes and copies) / the seed's hand-written method",
        "request index 3 consumers/uncached",
        "request index 3 consumers/hand-written",
    ),
    Row(
        "request index per step, V2's six groups (a metadata object each): stepcache "
        "inside a scope / hand-threading the seed's slot from group to group",
        "request index 6 groups/stepcache",
        "request index 6 groups/hand-written",
        1.25,
        "issue 43",
    ),
    Row(
        "request index per step, six groups: uncached / hand-threading the seed's slot",
        "request index 6 groups/uncached",
        "request index 6 groups/hand-written",
    ),
]


def render(results: dict[str, Any]) -> str:
    """The rows and the benchmarks of a results file, as Markdown."""
    work = [
        [shape, *(str(n) for n in by_variant.values())]
        for shape, by_variant in results["work_per_step"].items()
    ]
    variants = list(next(iter(results["work_per_step"].values())))
    return "\n\n".join(
        [
            markdown_table(
                ["request index: copies into the index buffers per step", *variants],
                work,
                "l" + "r" * len(variants),
            ),
            _pyperf.rows_table(results["rows"], "row (ratio of medians)", goals=True),
            _pyperf.summaries_table(results["benchmarks"], "benchmark"),
        ]
    )


def goal_rows(results: dict[str, Any]) -> str:
    """The rows with a limit, as rows of the benchmarks page's goals table."""
    return _pyperf.goal_rows(results["rows"])


def run(results: Path, options: Sequence[str] = ()) -> dict[str, Any]:
    """Run this benchmark in a process of its own (pyperf allows one runner per
    process), with pyperf ``options``; its results, as written to ``results``."""
    return _pyperf.run_module(MODULE, results, options)


def main(argv: Sequence[str] | None = None) -> int:
    runner = _pyperf.runner(MODULE, processes=PROCESSES, values=VALUES, results=RESULTS)
    args = runner.parse_args(None if argv is None else list(argv))
    torch.set_num_threads(1)
    rows = [r for r in ROWS if args.rows in r.label]
    names = list(dict.fromkeys(n for r in rows for n in (r.measured, r.baseline)))
    started = time.time()
    work = {} if args.worker else work_per_step()
    done = _pyperf.register(runner, [BENCHES[n] for n in names])
    if args.worker:
        return 0
    given = sys.argv[1:] if argv is None else list(argv)
    results = {
        **_pyperf.results_header(["python", "-m", MODULE, *given], started),
        "work_per_step": work,
        "benchmarks": {n: _pyperf.summary(done[n]) for n in names},
        "rows": [_pyperf.row_result(r, done) for r in rows],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    print()
    print(render(results))
    print(f"\nbench_cold: wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
