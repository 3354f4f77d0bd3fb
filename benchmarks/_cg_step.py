# SPDX-License-Identifier: Apache-2.0
"""One variant's DSv4 steps under callgrind, instrumented only around the steps.

Run by :mod:`benchmarks.bench_instructions` as
``valgrind --tool=callgrind --instr-atstart=no python -m benchmarks._cg_step VARIANT
STEPS LAYERS TOKENS``: start-up and five warm-up steps run uninstrumented, then
``callgrind_control -i on`` counts the instructions of ``STEPS`` steps.

The variant ``stepcache-without-expect`` counts the stepcache steps with the ``expect``
check of both integrations' decorated functions turned off: the difference to
``stepcache`` is what validating each stored value costs a step.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from collections.abc import Callable

from demo import demo
from stepcache.integrations.dsv4 import request_index
from stepcache.integrations.dsv4 import sim as dsv4_sim


def _count(run: Callable[[], object], times: int) -> None:
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True)
    for _ in range(times):
        run()
    subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True)


def without_expect() -> None:
    """Turn off ``expect`` on the request index and the decorated sparse-index
    builder (a patch of the functions' records, for this measurement only)."""
    for fn in (
        request_index.token_to_req_indices,
        dsv4_sim.Builders.cached_sparse_indices,
    ):
        record = getattr(fn, "__stepcache__")  # noqa: B009 (set by step_cached)
        if record.expect is None:
            raise RuntimeError(f"{record.name} has no expect to turn off")
        record.expect = None


def main(argv: list[str]) -> None:
    variant, steps, layers, tokens = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    gc.disable()  # a collection would land in one variant's count only
    if variant == "stepcache-without-expect":
        without_expect()
        variant = "stepcache"
    kinds = demo.layer_kinds(layers)
    builders = dsv4_sim.Builders(8192)
    lens = [1] * min(tokens, 256) + ([tokens - 256] if tokens > 256 else [])
    metas = [dsv4_sim.make_step(lens) for _ in range(steps + 5)]
    for meta in metas[:5]:
        demo.build_step(meta, builders, variant, kinds)  # type: ignore[arg-type]
    later = iter(metas[5:])
    _count(lambda: demo.build_step(next(later), builders, variant, kinds), steps)  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1:])
