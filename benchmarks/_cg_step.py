# SPDX-License-Identifier: Apache-2.0
"""One variant's DSv4 steps under callgrind, instrumented only around the steps.

Run by :mod:`benchmarks.bench_instructions` as
``valgrind --tool=callgrind --instr-atstart=no python -m benchmarks._cg_step VARIANT
STEPS LAYERS TOKENS``: start-up and five warm-up steps run uninstrumented, then
``callgrind_control -i on`` counts the instructions of ``STEPS`` steps.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from benchmarks._sim import demo, dsv4_sim


def main(argv: list[str]) -> None:
    variant, steps, layers, tokens = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    gc.disable()  # a collection would land in one variant's count only
    kinds = demo.layer_kinds(layers)
    builders = dsv4_sim.Builders(8192)
    lens = [1] * min(tokens, 256) + ([tokens - 256] if tokens > 256 else [])
    metas = [dsv4_sim.make_step(lens) for _ in range(steps + 5)]
    for meta in metas[:5]:
        demo.build_step(meta, builders, variant, kinds)  # type: ignore[arg-type]
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True)
    for meta in metas[5:]:
        demo.build_step(meta, builders, variant, kinds)  # type: ignore[arg-type]
    subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True)


if __name__ == "__main__":
    main(sys.argv[1:])
