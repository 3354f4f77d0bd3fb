# SPDX-License-Identifier: Apache-2.0
"""What one call costs: stepcache's hit against functools, cachetools and hand-written caches.

Run: ``python -m benchmarks.bench_hit [--fast] [--rows TEXT] [--results PATH]`` (and
any other pyperf option). Each benchmark is one statement as written at a call site
(``m.sc_key(3)``, no lambda around it), timed by pyperf in worker processes of its own
after its first call (a miss), the cost of an empty loop of the same length
subtracted. A process's memory layout and string-hash seed move some benchmarks by
tens of percent for its whole life, hence several processes per benchmark.
"""

from __future__ import annotations

import functools
import operator
import sys
from collections.abc import Sequence
from typing import Any

import cachetools
import torch

import stepcache
from benchmarks import _pyperf
from benchmarks._pyperf import Mode, Prepare, Row
from stepcache import step_cached
from stepcache.integrations.dsv4 import request_index, seed
from stepcache.integrations.dsv4 import sim as dsv4_sim

MODULE = "benchmarks.bench_hit"
RESULTS = _pyperf.ROOT / "build" / "benchmarks" / "hit.json"


class Meta:
    def __init__(self) -> None:
        self._cachetools: dict[Any, Any] = {}

    @step_cached(key="k")
    def sc_key(self, k: int) -> int:
        return k

    @step_cached()
    def sc_getter(self) -> int:
        return 1

    @functools.lru_cache  # noqa: B019 - the baseline being measured (default maxsize)
    def lru(self, k: int) -> int:
        return k

    @functools.cached_property
    def cprop(self) -> int:
        return 1

    @cachetools.cachedmethod(operator.attrgetter("_cachetools"))
    def ct(self, k: int) -> int:
        return k

    def plain(self, k: int) -> int:
        return k


class KeptSliceMetadata(seed.SeedMetadata):
    """The seed's metadata with a cache that keeps the slice it returned and hands it
    back, checking nothing: the floor of a cache that stores its result."""

    _kept_slice: torch.Tensor | None = None

    def token_to_req_indices(self, buffer: torch.Tensor) -> torch.Tensor:
        kept = self._kept_slice
        if kept is None:
            kept = self._kept_slice = seed.handwritten_token_to_req_indices(
                self, buffer
            )
        return kept


CHECKS: Mode = functools.partial(stepcache.debug, "checks")

#: every benchmark: its name, what it does, the statement timed and its mode
# fmt: off
CALLS: list[tuple[str, str, str, Mode | None]] = [
    ("rix", "request index, stepcache hit: re-checks 2 tensors (identity, version "
     "counter), 1 int and its result's version counter", "rix(step, buf)", None),
    ("rix inference", "request index, stepcache hit on inference tensors (made under "
     "`torch.inference_mode()`, as vLLM's step tensors): re-reads 2 tensors' data "
     "pointer, shape, strides, dtype and device", "rix(step_inference, buf)", None),
    ("rix scope", "request index, stepcache hit on inference tensors inside a scope: "
     "re-checks 2 tensors' identity (each value opens the scope: one miss, then hits)",
     "rix(step_scoped, buf)", stepcache.scope),
    ("rix checks", "request index, stepcache hit in checks mode: compares the 2 "
     "tensors' contents, validates `expect`, hands out a guarded view",
     "rix(step_checks, buf)", CHECKS),
    ("rix seed", "request index, stock vLLM's method (the seed's hit, PR 47474): 3 "
     "asserts and a new slice each call", "seed.token_to_req_indices(buf)", None),
    ("rix kept", "request index, a hand-written cache that keeps its slice: returns "
     "it, checks nothing", "kept.token_to_req_indices(buf)", None),
    ("key", "stepcache hit, key of one argument (`return k`)", "m.sc_key(3)", None),
    ("key checks", "the same in checks mode", "m_checks.sc_key(3)", CHECKS),
    ("key disabled", "the same under `stepcache.disabled()`: calls through every time",
     "m_off.sc_key(3)", stepcache.disabled),
    ("plain", "the same method undecorated", "m.plain(3)", None),
    ("lru_cache", "`functools.lru_cache` hit (`return k`)", "m.lru(3)", None),
    ("cachetools", "`cachetools.cachedmethod` hit (`return k`)", "m.ct(3)", None),
    ("getter", "stepcache hit, zero-argument getter (`return 1`)", "m.sc_getter()", None),
    ("cached_property", "`functools.cached_property` hit (`return 1`)", "m.cprop", None),
]
# fmt: on
DOES = {name: does for name, does, _, _ in CALLS}


def namespace() -> dict[str, Any]:
    """The statements' objects: one step of 8 requests padded to 16 tokens. The
    checks-mode rows have owners of their own, stored in checks mode; the buffer, as
    vLLM's persistent buffers, is made outside inference mode."""
    lens = [3, 1, 1, 0, 2, 1, 1, 1]
    step = dsv4_sim.make_step(lens, pad_to=16)
    with torch.inference_mode():
        inference_step = dsv4_sim.make_step(lens, pad_to=16)
        scoped_step = dsv4_sim.make_step(lens, pad_to=16)
    qsl, qsl_cpu = step.query_start_loc, step.query_start_loc_cpu
    return {
        "m": Meta(),
        "m_checks": Meta(),
        "m_off": Meta(),
        "kept": KeptSliceMetadata(qsl, qsl_cpu, 16),
        "seed": seed.SeedMetadata(qsl, qsl_cpu, 16),
        "step": step,
        "step_checks": dsv4_sim.make_step(lens, pad_to=16),
        "step_inference": inference_step,
        "step_scoped": scoped_step,
        "rix": request_index.token_to_req_indices,
        "buf": torch.zeros(64, dtype=torch.int32),
    }


BENCHES: dict[str, Prepare] = {
    name: _pyperf.statement(stmt, namespace, mode) for name, _, stmt, mode in CALLS
}

_RIX = "request-index hit (8 requests, 16 tokens)"
_KEY = "keyed hit (`return k`)"
# fmt: off
ROWS = [
    Row("rix/seed", f"{_RIX}: stepcache (re-checks 2 tensors, 1 int, its result) / "
        "stock vLLM's method (3 asserts, a new slice)", "rix", "rix seed", 0.25, "issue 5"),
    Row("rix inference/seed", f"{_RIX} on inference tensors: stepcache (re-reads 5 "
        "properties of 2 tensors) / stock vLLM's method", "rix inference", "rix seed"),
    Row("rix scope/rix", f"{_RIX}: stepcache on inference tensors inside a scope "
        "(re-checks identity) / stepcache on version-counted tensors", "rix scope",
        "rix", 1.2, "issue 38"),
    Row("rix checks/rix", f"{_RIX}: stepcache in checks mode (compares contents, "
        "validates `expect`) / in production", "rix checks", "rix", 4.0, "issue 56"),
    Row("rix/kept", f"{_RIX}: stepcache / a hand-written cache that keeps its slice "
        "and checks nothing", "rix", "rix kept"),
    Row("key/lru_cache", f"{_KEY}: stepcache / `functools.lru_cache`", "key",
        "lru_cache", 1.6, "issue 56"),
    Row("key checks/key", f"{_KEY}: stepcache in checks mode / in production",
        "key checks", "key", 5.0, "issues 3, 5"),
    Row("key/cachetools", f"{_KEY}: stepcache / `cachetools.cachedmethod`", "key",
        "cachetools", 0.2, "issue 2"),
    Row("getter/cached_property", "zero-argument getter hit (`return 1`): stepcache / "
        "`functools.cached_property`", "getter", "cached_property", 1.5, "issue 2"),
    Row("disabled/plain", "a call under `stepcache.disabled()` (counts itself, calls "
        "through) / the same method undecorated", "key disabled", "plain"),
    Row("key/plain", f"{_KEY}: stepcache / the method undecorated (no cache)", "key",
        "plain"),
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
        extra=lambda: {"does": DOES},
    )


if __name__ == "__main__":
    sys.exit(main())
