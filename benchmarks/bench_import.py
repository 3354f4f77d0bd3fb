# SPDX-License-Identifier: Apache-2.0
"""Import time: what ``import stepcache`` adds to ``import torch``, and what it loads.

Run: ``python -m benchmarks.bench_import [--processes N]``. ``N`` fresh processes from
the repository root (after a warm-up process that leaves the files in the OS's cache
and writes stepcache's bytecode, as an install does) run :data:`COMMAND`; torch comes
first, so the cumulative ``stepcache`` entry holds only what ``import stepcache``
adds. One more process lists what ``import stepcache`` loads after torch: none of
:data:`LAZY`. Goals (issue 19): the median entry <= 50 ms, none of :data:`LAZY`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROCESSES = 5
LIMIT_MS = 50.0
STATEMENT = "import torch; import stepcache"
COMMAND = f'python -X importtime -c "{STATEMENT}"'
#: modules (and their submodules) that ``import stepcache`` must not load
LAZY = (
    "stepcache.profiler",
    "stepcache.integrations",
    "stepcache.pytest_plugin",
    "stepcache_pytest",
    "pytest",
    "attrs",
    "attr",
    "vllm",
)
# json is imported before the snapshot, so that it is not counted as stepcache's
_MODULES_SCRIPT = """\
import json, sys
import torch
before = set(sys.modules)
import stepcache
print(json.dumps({"new": sorted(set(sys.modules) - before), "file": stepcache.__file__}))
"""


def _python(*args: str) -> str:
    """``python args`` in a fresh process from the repository root (``-c`` puts it
    first on ``sys.path``); its standard error and output."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"bench_import: {args} failed:\n{done.stderr[-2000:]}")
    return done.stderr + done.stdout


def top_level_us(importtime: str) -> dict[str, int]:
    """Cumulative microseconds of each top-level entry of ``-X importtime`` output.

    >>> top_level_us(
    ...     "import time: self [us] | cumulative | imported package\\n"
    ...     "import time:       100 |        300 |   torch._C\\n"
    ...     "import time:       400 |        700 | torch\\n"
    ... )
    {'torch': 700}
    """
    found: dict[str, int] = {}
    for line in importtime.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3:
            cumulative, name = parts[1].strip(), parts[2]
            # a nested module is indented by two more spaces per level
            if cumulative.isdigit() and not name.startswith("  "):
                found[name.strip()] = int(cumulative)
    return found


def is_lazy(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in LAZY)


def run(processes: int = PROCESSES, warmup: int = 1) -> dict[str, Any]:
    times = []
    for i in range(warmup + processes):
        entries = top_level_us(_python("-X", "importtime", "-c", STATEMENT))
        if i >= warmup:
            times.append((entries["torch"], entries["stepcache"]))
    found = json.loads(_python("-c", _MODULES_SCRIPT).strip().splitlines()[-1])
    if not Path(found["file"]).resolve().is_relative_to(ROOT):
        raise RuntimeError(
            f"bench_import: imported {found['file']}, not the checkout's"
        )
    stdlib = set(sys.stdlib_module_names) | {"torch", "numpy"}
    return {
        "command": COMMAND,
        "processes": processes,
        "warmup_processes": warmup,
        "torch_us": [t for t, _ in times],
        "stepcache_us": [s for _, s in times],
        "stepcache_median_ms": statistics.median(s for _, s in times) / 1e3,
        "torch_median_ms": statistics.median(t for t, _ in times) / 1e3,
        "limit_ms": LIMIT_MS,
        "modules_loaded": found["new"],
        "outside_stdlib": [m for m in found["new"] if m.split(".")[0] not in stdlib],
        "lazy_checked": list(LAZY),
        "lazy_loaded": [m for m in found["new"] if is_lazy(m)],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--processes", type=int, default=PROCESSES)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.processes), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
