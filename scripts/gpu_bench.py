# SPDX-License-Identifier: Apache-2.0
"""Run the GPU benchmark (``benchmarks.bench_gpu``) from a checkout: python scripts/gpu_bench.py.

Works from the checkout without installing stepcache. Needs torch with CUDA; without a GPU it
says so and exits 0. Options: see ``--help`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bootstrap() -> None:
    sys.path.insert(0, str(ROOT))  # the benchmarks live in the checkout


if __name__ == "__main__":
    _bootstrap()
    from benchmarks.bench_gpu import main

    raise SystemExit(main(sys.argv[1:]))
