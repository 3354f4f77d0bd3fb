# SPDX-License-Identifier: Apache-2.0
"""Run the GPU benchmark (``benchmarks.bench_gpu``) from a checkout: python scripts/gpu_bench.py.

Works without installing stepcache: when ``stepcache.integrations`` cannot be
imported (the package maps the top-level ``integrations/`` folder to it only when
installed), it is loaded from the checkout. Needs torch with CUDA; without a GPU it
says so and exits 0. Options: see ``--help`` (``--quick`` for a smoke run).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bootstrap() -> None:
    sys.path.insert(0, str(ROOT))
    try:
        importlib.import_module("stepcache.integrations")
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "stepcache.integrations",
            ROOT / "integrations" / "__init__.py",
            submodule_search_locations=[str(ROOT / "integrations")],
        )
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules["stepcache.integrations"] = module
        spec.loader.exec_module(module)


if __name__ == "__main__":
    _bootstrap()
    from benchmarks.bench_gpu import main

    raise SystemExit(main(sys.argv[1:]))
